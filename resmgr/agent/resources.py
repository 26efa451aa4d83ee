"""The custom resources the agent reads and writes: names shared by the agent, the CRD
generator (scripts/crd.py) and the Helm chart."""

from __future__ import annotations

# Our configuration: one namespaced kind, objects named default, group.<GROUP>, node.<NODE>.
GROUP = "config.cri-resource-manager.intel.com"
VERSION = "v1alpha1"
KIND = "ResourceManagerConfig"
PLURAL = "resourcemanagerconfigs"
SINGULAR = "resourcemanagerconfig"
SHORT_NAMES = ["rmconfig"]

# NodeResourceTopology, as the topology-aware scheduler plugin reads it: cluster-scoped, one per node.
NRT_GROUP = "topology.node.k8s.io"
NRT_VERSION = "v1alpha2"
NRT_KIND = "NodeResourceTopology"
NRT_PLURAL = "noderesourcetopologies"

SUCCESS, FAILURE = "Success", "Failure"
