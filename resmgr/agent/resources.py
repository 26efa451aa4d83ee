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

# Each node's own report of what it runs: one object per node, named after it, in the config
# namespace, owned by the Node. The tally sums them into each ResourceManagerConfig's status.
NODE_KIND = "ResourceManagerNodeStatus"
NODE_PLURAL = "resourcemanagernodestatuses"
NODE_SINGULAR = "resourcemanagernodestatus"
NODE_SHORT_NAMES = ["rmstatus"]
STATUS_LABEL = f"{GROUP}/status"  # Success or Failure, for `kubectl get rmstatus -l`
FAILURES_LISTED = 20  # nodes named, with their errors, in a configuration's status

# NodeResourceTopology, as the topology-aware scheduler plugin reads it: cluster-scoped, one per node.
NRT_GROUP = "topology.node.k8s.io"
NRT_VERSION = "v1alpha2"
NRT_KIND = "NodeResourceTopology"
NRT_PLURAL = "noderesourcetopologies"

SUCCESS, FAILURE = "Success", "Failure"
REJECTED_REASON = "ConfigRejected"  # the Warning Event's reason when nodes reject a configuration

# Dynamic Resource Allocation (resource.k8s.io/v1, GA in Kubernetes 1.34).
DRA_GROUP = "resource.k8s.io"
DRA_VERSION = "v1"
SLICE_KIND = "ResourceSlice"
