"""DRA devices as a cluster with alpha gates takes them: every component with DRANodeAllocatableResources
(KEP-5517) and DRAListTypeAttributes on, one node of one NUMA node and two CPUs, each its own L3
domain (tests/support/dracluster.py), cri-resmgr the NRI plugin of the node's containerd (the
relay runs the other DRA scenarios, tests/cluster/test_scheduler.py), its agent publishing with
--dra-node-allocatable and --dra-numa-list. CPUs a claim takes then count against the node's
allocatable cpu, for kube-scheduler and for kubelet's admission alike; the NUMA node's device and
its L3 domains' share counters (partitionable devices, KEP-4815, beta and on by default), so the
scheduler never allocates both."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from harness.kube import pod_manifest
from resmgr.agent.kube import Backoff
from resmgr.agent.publish import SliceExporter, SliceShape
from resmgr.topology.cpuset import CPUSet
from tests.support.agentenv import status_doc, wait_for
from tests.support.dracluster import (
    CLAIMS,
    DRIVER,
    MACHINES,
    NIC,
    WIDE,
    Cluster,
    allocated,
    make_aligned_claim,
    make_claim,
    nic_class,
    nic_driver,
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
    c = Cluster({WIDE: MACHINES[WIDE] + ",l3=1"}, GATES, ("--dra-node-allocatable", "on", "--dra-numa-list", "on"),
                front="nri")
    try:
        yield c.start()
    finally:
        c.stop()


def slices(cluster: Cluster) -> list[dict[str, Any]]:
    return [s for s in cluster.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
            if s["spec"]["driver"] == DRIVER]


def devices(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices(cluster) for d in s["spec"].get("devices") or []}


def test_claimed_cpus_count_against_the_node(gated: Cluster) -> None:
    # The API server takes the slice as the gates shape it: the standard attribute a list, the
    # device's cpu capacity mapped to the node's cpu.
    numa = wait_for(lambda: devices(gated), 60, "the node's slice")["numa-0"]
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


def test_a_numa_node_and_its_l3_domains_are_never_allocated_together(gated: Cluster) -> None:
    # The counters are a slice of their own in the node's pool; the NUMA node consumes both domains.
    assert wait_for(lambda: len(slices(gated)) == 2, 60, "the counters' slice")
    [counters] = [s for s in slices(gated) if "sharedCounters" in s["spec"]]
    assert {k: v["value"] for k, v in counters["spec"]["sharedCounters"][0]["counters"].items()} == \
        {name: "1" for name in devices(gated) if name.startswith("l3-")}

    # One CPU of the NUMA node claimed: an L3 domain's claim waits, though the other CPU is free.
    make_claim(gated, "numa-one", "1")
    submit_claiming(gated, "on-numa", "numa-one")
    gated.placed("on-numa", WIDE)
    make_claim(gated, "l3-one", "1", kind="l3")
    submit_claiming(gated, "on-l3", "l3-one")
    message = wait_for(lambda: gated.unschedulable("on-l3"), 60, "the L3 claim unschedulable")
    assert "cannot allocate all claims" in message, message

    # The NUMA node's claim gone, the domain's is allocated and its pod runs on the domain's CPU.
    node = gated.nodes[WIDE]
    node.delete("on-numa", 60)
    gated.custom.delete_namespaced_custom_object(*CLAIMS, "numa-one")
    gated.placed("on-l3", WIDE, 120)
    [held] = status_doc(gated.config_socket(WIDE))["dra"]["claims"]
    assert held["device"].startswith("l3-") and node.cpus("on-l3") == {"c0": CPUSet.parse(held["cpus"])}
    node.delete("on-l3", 60)
    gated.custom.delete_namespaced_custom_object(*CLAIMS, "l3-one")


class _Node:
    """What the exporter asks of the cluster to shape slices: the node's name, no owner."""

    node_name = WIDE

    def owner(self, node: Any) -> list[dict[str, Any]]:
        return []


def test_a_node_of_many_devices_publishes_them_in_several_slices(gated: Cluster) -> None:
    # One device per CPU of a 150-CPU node, each with the standard attribute as a list: more than
    # one slice takes (64 with list attributes), so the pool spans three, which the API server takes.
    exporter = SliceExporter(_Node(), "", 1, lambda: None, lambda: Backoff(0.01, 0.02),  # type: ignore[arg-type]
                             shape=SliceShape(numa_list=True))
    many = [{"name": f"cpu-{c}", "attributes": {"kind": "cpu", "cpuID": c, NUMA_NODE: c // 75}, "cpus": 1}
            for c in range(150)]
    body = exporter.body({"driver": "many.example.com", "devices": many})
    api = ("resource.k8s.io", "v1", "resourceslices")
    names = []
    try:
        for one in body["slices"]:
            names.append(gated.custom.create_cluster_custom_object(*api, one)["metadata"]["name"])
        stored = [gated.custom.get_cluster_custom_object(*api, n)["spec"] for n in names]
        assert [len(s["devices"]) for s in stored] == [64, 64, 22]
        assert {s["pool"]["resourceSliceCount"] for s in stored} == {3}
        # The limit is the API server's: one slice of them all is refused.
        whole = {**body["slices"][0], "metadata": {"name": "many-at-once"}}
        whole["spec"] = {**whole["spec"], "devices": [d for s in body["slices"] for d in s["spec"]["devices"]]}
        with pytest.raises(ApiException) as refused:
            gated.custom.create_cluster_custom_object(*api, whole)
        assert refused.value.status == 422 and "Too many" in refused.value.body, refused.value.body
    finally:
        for n in names:
            gated.custom.delete_cluster_custom_object(*api, n)


def test_cpus_in_list_form_align_with_another_drivers_scalar(gated: Cluster) -> None:
    # Our devices say numaNode as a list ([0]), the NIC driver's as a scalar (0), as drivers not yet
    # moved to lists do: the scheduler matches them all the same.
    nic_class(gated)
    driver = nic_driver(gated, WIDE, **{"nic-0": 0})
    try:
        make_aligned_claim(gated, "aligned", "1")
        submit_claiming(gated, "with-nic", "aligned")
        gated.placed("with-nic", WIDE)
        assert allocated(gated, "aligned") == {"cpus": "numa-0", "nic": "nic-0"}
        [held] = status_doc(gated.config_socket(WIDE))["dra"]["claims"]
        assert gated.nodes[WIDE].cpus("with-nic") == {"c0": CPUSet.parse(held["cpus"])}
        assert "prepare default/aligned nic-0" in driver.log()
    finally:
        with contextlib.suppress(ApiException):
            gated.nodes[WIDE].delete("with-nic", 60)
        with contextlib.suppress(ApiException):
            gated.custom.delete_namespaced_custom_object(*CLAIMS, "aligned")
        driver.stop()
        gated.custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", NIC)

