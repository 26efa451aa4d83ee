"""DRA devices as a cluster with alpha gates takes them: every component with DRANodeAllocatableResources
(KEP-5517) and DRAListTypeAttributes on, one node of one NUMA node and two CPUs (the "wide" node of
tests/support/dracluster.py), its agent publishing with --dra-node-allocatable and --dra-numa-list.
CPUs a claim takes then count against the node's allocatable cpu, for kube-scheduler and for
kubelet's admission alike."""

from __future__ import annotations

from typing import Any

import pytest

from harness.kube import pod_manifest
from resmgr.topology.cpuset import CPUSet
from tests.support.agentenv import wait_for
from tests.support.dracluster import (
    CLAIMS,
    DRIVER,
    MACHINES,
    WIDE,
    Cluster,
    make_claim,
    submit_claiming,
)
from tests.support.helpers import ONLINE
from tests.support.kubenode import NAMESPACE

pytestmark = [pytest.mark.skipif(not CPUSet.parse("0-1") <= ONLINE, reason="the generated CPUs must exist here"),
              pytest.mark.timeout(600)]

GATES = {"DRANodeAllocatableResources": True, "DRAListTypeAttributes": True}
NUMA_NODE = "resource.kubernetes.io/numaNode"


@pytest.fixture(scope="module")
def gated():
    c = Cluster({WIDE: MACHINES[WIDE]}, GATES, ("--dra-node-allocatable", "on", "--dra-numa-list", "on"))
    try:
        yield c.start()
    finally:
        c.stop()


def devices(cluster: Cluster) -> list[dict[str, Any]]:
    slices = cluster.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
    return [d for s in slices if s["spec"]["driver"] == DRIVER for d in s["spec"].get("devices") or []]


def test_claimed_cpus_count_against_the_node(gated: Cluster) -> None:
    # The API server takes the slice as the gates shape it: the standard attribute a list, the
    # device's cpu capacity mapped to the node's cpu.
    [numa] = wait_for(lambda: devices(gated), 60, "the node's slice")
    assert numa["attributes"][NUMA_NODE] == {"ints": [0]}
    assert numa["nodeAllocatableResources"] == {"cpu": {"mapping": {"capacityKey": "cpu", "capacityMultiplier": "1"}}}

    # A claim of both CPUs, its pod running on them.
    make_claim(gated, "all", "2")
    submit_claiming(gated, "claimed", "all")
    gated.placed("claimed", WIDE)
    node = gated.nodes[WIDE]
    assert node.cpus("claimed") == {"c0": CPUSet.parse("0-1")}

    # A pod asking for the node's whole allocatable cpu no longer fits: the scheduler counts the claim.
    allocatable = gated.core.read_node(WIDE).status.allocatable["cpu"]
    manifest = pod_manifest("asking", "", cpu=allocatable, memory="64Mi")
    del manifest["spec"]["nodeName"]
    gated.core.create_namespaced_pod(NAMESPACE, manifest)
    message = wait_for(lambda: gated.unschedulable("asking"), 60, "the pod found unschedulable")
    assert "Insufficient cpu" in message, message

    # So does kubelet: the same pod bound to the node directly is refused at admission.
    gated.core.create_namespaced_pod(NAMESPACE, pod_manifest("bound", WIDE, cpu=allocatable, memory="64Mi"))
    refused = wait_for(lambda: (lambda p: p.status.reason if p.status.phase == "Failed" else "")(
        gated.core.read_namespaced_pod("bound", NAMESPACE)), 60, "kubelet's refusal")
    assert refused == "OutOfcpu", refused
    gated.core.delete_namespaced_pod("bound", NAMESPACE)

    # The claim's pod and the claim gone, the waiting pod fits.
    node.delete("claimed", 60)
    gated.custom.delete_namespaced_custom_object(*CLAIMS, "all")
    gated.placed("asking", WIDE, 120)
    node.delete("asking", 60)
