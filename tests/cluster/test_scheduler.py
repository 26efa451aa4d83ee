"""Schedulers reading what our agent publishes, over two nodes, each a kubelet on cri-resmgr (relay,
topology-aware) whose agent exports the node's NodeResourceTopology and its ResourceSlice:

- the topology-aware scheduler plugin, NodeResourceTopologyMatch of kubernetes-sigs/scheduler-plugins,
  as a second scheduler beside kube-scheduler;
- kube-scheduler allocating ResourceClaims from the DRA devices cri-resmgr offers as kubelet's DRA
  driver, which kubelet then has cri-resmgr prepare (docs/dra.md; tests/cluster/test_helm.py does
  the same with the chart's NRI plugin pod): claims of CPUs alone, CPUs aligned with a second
  driver's device by `resource.kubernetes.io/numaNode`, and a DeviceClass's extended resource.

Both nodes have this machine's CPUs 0 and 1, and kubelet counts the same allocatable CPUs on both;
only their topology differs, as each cri-resmgr reads it from a generated sysfs: one NUMA node of
two CPUs ("wide") and two NUMA nodes of one CPU each ("split"). A Guaranteed pod of two CPUs fits
the split node by kubelet's count but cannot be aligned there, so the plugin must send it to the
wide node; with the wide node full it must wait rather than go to the split one. The same holds for
a claim of two CPUs of one NUMA node: only the wide node has a device that big."""

from __future__ import annotations

import contextlib
import json
import signal
from typing import Any

import pytest
from kubernetes import client

from harness.kube import container_ids, pod_manifest
from resmgr.topology.cpuset import CPUSet
from tests.support.agentenv import attrs, cpu, status_doc, wait_for, zones
from tests.support.dracluster import (
    CLAIMS,
    DRIVER,
    EXTENDED,
    MACHINES,
    NIC,
    SPLIT,
    WIDE,
    Cluster,
    allocated,
    make_aligned_claim,
    make_claim,
    nic_class,
    nic_driver,
    submit_claiming,
)
from tests.support.helpers import ONLINE, cgroup_cpuset, container_cgroup, wait_socket
from tests.support.kubenode import NAMESPACE, KubeNode

pytestmark = [pytest.mark.skipif(not CPUSet.parse("0-1") <= ONLINE, reason="the generated CPUs must exist here"),
              pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        yield c.start()
    finally:
        c.stop()


def node_zone_cpu(nrt: dict[str, Any], zone: str) -> str:
    return cpu(zones(nrt)[zone])["available"]


def test_a_guaranteed_pod_goes_to_the_node_that_can_align_it(cluster: Cluster) -> None:
    # What the plugin judges by: each node's object says what its cri-resmgr says, and that the
    # node aligns a container to one NUMA node.
    for node in MACHINES:
        nrt = wait_for(lambda node=node: cluster.agreed(node), 60, f"{node}'s NodeResourceTopology")
        assert attrs(nrt)["topologyManagerPolicy"] == "single-numa-node"
        assert attrs(nrt)["topologyManagerScope"] == "container"
    split = cluster.topology(SPLIT)
    assert (node_zone_cpu(split, "node-0"), node_zone_cpu(split, "node-1")) == ("1", "1")
    assert node_zone_cpu(cluster.topology(WIDE), "node-0") == "2"

    cluster.submit("aligned", "2")
    pod = cluster.placed("aligned", WIDE)
    assert pod.spec.node_name == WIDE
    assert cluster.nodes[WIDE].cpus("aligned") == {"c0": CPUSet.parse("0-1")}
    # The plugin turned the split node down, not a count of CPUs (kubelet's are the same on both).
    assert any('"cannot align container" pod="default/aligned"' in line and f'node="{SPLIT}"' in line
               for line in cluster.scheduler.log().splitlines())
    nrt = wait_for(lambda: (t := cluster.agreed(WIDE)) and node_zone_cpu(t, "node-0") == "0" and t, 30,
                   "the wide node's CPUs taken in its NodeResourceTopology")

    # Another such pod: the wide node has no CPU left and the split one cannot align it, so it waits.
    cluster.submit("waiting", "2")
    message = wait_for(lambda: cluster.unschedulable("waiting"), 60, "the pod found unschedulable")
    assert "cannot align" in message, message
    assert cluster.core.read_namespaced_pod("waiting", NAMESPACE).spec.node_name is None

    # The first pod gone, the object that says so lets the scheduler place the second on the wide node.
    cluster.nodes[WIDE].delete("aligned", 60)
    pod = cluster.placed("waiting", WIDE, 120)
    assert pod.spec.node_name == WIDE
    cluster.nodes[WIDE].delete("waiting", 60)



# -- DRA: CPUs as devices ---------------------------------------------------------------------------
def published(cluster: Cluster, node: str) -> dict[str, int]:
    """The node's ResourceSlice of our driver: device name -> its CPU capacity."""
    slices = cluster.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
    mine = [s for s in slices if s["spec"].get("nodeName") == node and s["spec"]["driver"] == DRIVER]
    assert len(mine) <= 1, mine
    return {d["name"]: int(d["capacity"]["cpu"]["value"]) for d in mine[0]["spec"]["devices"]} if mine else {}


def offered(cluster: Cluster, node: str) -> dict[str, int]:
    """What `cri-resmgr status` says the node offers."""
    return {d["name"]: d["cpus"] for d in status_doc(cluster.config_socket(node))["dra"]["devices"]}


def agreed_slice(cluster: Cluster, node: str) -> dict[str, int] | None:
    now = published(cluster, node)
    return now if now and now == offered(cluster, node) else None


def container_file(node: KubeNode, pod: str, name: str) -> str:
    """A cgroup file of the pod's first container ("cpuset.mems", "cpu.shares")."""
    assert node.direct is not None
    cid = next(iter(container_ids(node.core.read_namespaced_pod(pod, NAMESPACE)).values()))
    parent, leaf = container_cgroup(node.direct, cid)
    if name.startswith("cpuset."):
        return str(cgroup_cpuset(parent, leaf, name.split(".", 1)[1]))
    return open(f"/sys/fs/cgroup/cpu/{parent.lstrip('/')}/{leaf}/{name}").read().strip()


def device_health(cluster: Cluster, pod: str) -> list[str]:
    """The health kubelet reports of the devices the pod's containers use (allocatedResourcesStatus)."""
    doc = json.loads(cluster.core.read_namespaced_pod(pod, NAMESPACE, _preload_content=False).data)
    return [r.get("health", "") for s in doc["status"].get("containerStatuses") or []
            for a in s.get("allocatedResourcesStatus") or [] for r in a.get("resources") or []]


def waiting_message(cluster: Cluster, pod: str) -> str:
    st = cluster.core.read_namespaced_pod(pod, NAMESPACE).status.container_statuses or []
    return " ".join(s.state.waiting.message or "" for s in st if s.state and s.state.waiting)


def test_cpus_of_one_numa_node_claimed_through_dra(cluster: Cluster) -> None:
    # The slices say what each cri-resmgr offers: one device per NUMA node with its CPUs.
    for node, devices in ((WIDE, {"numa-0": 2}), (SPLIT, {"numa-0": 1, "numa-1": 1})):
        assert wait_for(lambda node=node: agreed_slice(cluster, node), 60, f"{node}'s ResourceSlice") == devices

    # Two CPUs of one NUMA node: the scheduler allocates them on the wide node only, kubelet has
    # cri-resmgr prepare the claim, and the container runs on exactly its CPUs and memory node.
    make_claim(cluster, "two", "2", numa=0)  # by KEP-6072's attribute, as another driver's device aligns
    submit_claiming(cluster, "dra-claimed", "two")
    pod = cluster.placed("dra-claimed", WIDE)
    assert pod.spec.node_name == WIDE
    wide = cluster.nodes[WIDE]
    assert wide.cpus("dra-claimed") == {"c0": CPUSet.parse("0-1")}
    assert container_file(wide, "dra-claimed", "cpuset.mems") == "0"
    assert container_file(wide, "dra-claimed", "cpu.shares") == "2048"
    allocation = cluster.custom.get_namespaced_custom_object(*CLAIMS, "two")["status"]["allocation"]
    result = allocation["devices"]["results"][0]
    assert (result["driver"], result["pool"], result["device"], result["consumedCapacity"]) == \
        (DRIVER, WIDE, "numa-0", {"cpu": "2"})
    state = status_doc(cluster.config_socket(WIDE))["dra"]["claims"]
    assert [(c["name"], c["device"], c["cpus"]) for c in state] == [("two", "numa-0", "0-1")]
    assert len(list((wide.workdir / "ctrd" / "cdi").glob("*.json"))) == 1

    # A CPU of the device offline: kubelet hears it from the driver's health stream and says so in
    # the container's status; back online, healthy again.
    online = cluster.roots[WIDE] / "sys/devices/system/cpu/online"
    online.write_text("0\n")
    try:
        assert wait_for(lambda: "Unhealthy" in device_health(cluster, "dra-claimed"), 90, "the device unhealthy")
    finally:
        online.write_text("0-1\n")
    assert wait_for(lambda: device_health(cluster, "dra-claimed") == ["Healthy"], 90, "the device healthy again")

    # Another such claim has no node: the wide node's device is taken, the split node's are too small.
    make_claim(cluster, "two-more", "2")
    submit_claiming(cluster, "dra-waiting", "two-more")
    message = wait_for(lambda: cluster.unschedulable("dra-waiting"), 60, "the pod found unschedulable")
    assert "cannot allocate all claims" in message, message

    # cri-resmgr killed with the claim prepared: after its restart the container keeps its CPUs,
    # and the slices say the same as before.
    before = published(cluster, WIDE)
    assert wide.resmgr is not None
    wide.resmgr.stop(signal.SIGKILL)
    wide.resmgr.start()
    wait_socket(cluster.config_socket(WIDE))
    assert wait_for(lambda: agreed_slice(cluster, WIDE), 60, "the wide node's slice after the restart") == before
    assert [c["name"] for c in status_doc(cluster.config_socket(WIDE))["dra"]["claims"]] == ["two"]
    assert wide.cpus("dra-claimed") == {"c0": CPUSet.parse("0-1")}
    users = status_doc(cluster.config_socket(WIDE))["dra"]["claims"][0]["users"]
    assert len(users) == 1, users

    # Killed again, its state file lost: the claim is held again from its CDI spec, and the
    # container, adopted from containerd, is its user again (its CDI devices name the claim).
    wide.resmgr.stop(signal.SIGKILL)
    (wide.resmgr.relay_dir / "cache").unlink()
    wide.resmgr.start()
    wait_socket(cluster.config_socket(WIDE))
    claims = status_doc(cluster.config_socket(WIDE))["dra"]["claims"]
    assert [(c["name"], c["cpus"], c["users"]) for c in claims] == [("two", "0-1", users)], claims
    assert wide.cpus("dra-claimed") == {"c0": CPUSet.parse("0-1")}

    # One container on two claims is refused, naming both, on the split node's two devices.
    make_claim(cluster, "left", "1")
    make_claim(cluster, "right", "1")
    submit_claiming(cluster, "dra-both", "left", "right", node=SPLIT)
    message = wait_for(lambda: waiting_message(cluster, "dra-both"), 120, "the two-claim container refused")
    assert "default/left and claim default/right: a container can take its CPUs from one claim only" \
        in message or "default/right and claim default/left" in message, message
    cluster.nodes[SPLIT].delete("dra-both", 60)

    # The first pod gone, kubelet unprepares its claim: the CPUs are back in the slice, the claim is
    # deallocated, and the waiting pod gets the wide node.
    wide.delete("dra-claimed", 60)
    cluster.custom.delete_namespaced_custom_object(*CLAIMS, "two")
    pod = cluster.placed("dra-waiting", WIDE, 120)
    assert wide.cpus("dra-waiting") == {"c0": CPUSet.parse("0-1")}
    wide.delete("dra-waiting", 60)
    wait_for(lambda: not status_doc(cluster.config_socket(WIDE))["dra"]["claims"], 60, "the claim unprepared")


def test_pods_sharing_a_claim_split_its_cpu_time(cluster: Cluster) -> None:
    # A claim naming no amount takes the whole device; both pods run on its CPUs, each with half of
    # its CPU shares, and the one left has them all.
    make_claim(cluster, "shared")
    submit_claiming(cluster, "dra-first", "shared", node=WIDE)
    submit_claiming(cluster, "dra-second", "shared", node=WIDE)
    wide = cluster.nodes[WIDE]
    for name in ("dra-first", "dra-second"):
        cluster.placed(name, WIDE)
        assert wide.cpus(name) == {"c0": CPUSet.parse("0-1")}
    wait_for(lambda: container_file(wide, "dra-first", "cpu.shares") == "1024", 30, "the first pod's half")
    assert container_file(wide, "dra-second", "cpu.shares") == "1024"
    wide.delete("dra-second", 60)
    wait_for(lambda: container_file(wide, "dra-first", "cpu.shares") == "2048", 30, "the first pod's whole share")
    wide.delete("dra-first", 60)
    cluster.custom.delete_namespaced_custom_object(*CLAIMS, "shared")


def test_a_balloon_type_as_dra_devices(cluster: Cluster) -> None:
    # The wide node's own configuration: balloons, a type of which is published. Its slice follows.
    types = [{"Name": "dedicated", "MinBalloons": 1, "MaxCPUs": 1, "DRA": {"DeviceName": "dedicated"}}]
    with cluster.own_policy(WIDE, {"Active": "balloons", "balloons": {"BalloonTypes": types}}):
        assert wait_for(lambda: agreed_slice(cluster, WIDE) == {"dedicated-0": 1}, 60, "the balloon published")
        wide = cluster.nodes[WIDE]

        def balloon() -> dict[str, Any]:
            pools = status_doc(cluster.config_socket(WIDE))["pools"]
            return next(p for p in pools if p["name"] == "dedicated[0]")
        assert balloon()["cpus"] == ""  # no minimum: nothing until claimed

        # A claim naming no amount takes the whole balloon; two pods share it and split its CPU time.
        make_claim(cluster, "balloon", kind="balloon")
        submit_claiming(cluster, "dra-b1", "balloon", node=WIDE)
        submit_claiming(cluster, "dra-b2", "balloon", node=WIDE)
        for name in ("dra-b1", "dra-b2"):
            cluster.placed(name, WIDE)
        held = CPUSet.parse(balloon()["cpus"])
        assert len(held) == 1
        assert wide.cpus("dra-b1") == wide.cpus("dra-b2") == {"c0": held}
        wait_for(lambda: container_file(wide, "dra-b1", "cpu.shares") == "512", 30, "the first pod's half")
        assert container_file(wide, "dra-b2", "cpu.shares") == "512"
        allocation = cluster.custom.get_namespaced_custom_object(*CLAIMS, "balloon")["status"]["allocation"]
        assert allocation["devices"]["results"][0]["consumedCapacity"] == {"cpu": "1"}

        # A pod without a claim annotated into the published type is refused, and says why.
        manifest = pod_manifest("dra-annotated", WIDE)
        manifest["metadata"]["annotations"] = {"balloon.balloons.resource-policy.nri.io": "dedicated"}
        cluster.core.create_namespaced_pod(NAMESPACE, manifest)
        message = wait_for(lambda: waiting_message(cluster, "dra-annotated"), 60, "the annotated container refused")
        assert "balloon type dedicated is published as DRA devices" in message, message
        wide.delete("dra-annotated", 60)

        # The claim released, the balloon without a minimum gives its CPU back.
        wide.delete("dra-b1", 60)
        wide.delete("dra-b2", 60)
        cluster.custom.delete_namespaced_custom_object(*CLAIMS, "balloon")
        wait_for(lambda: balloon()["cpus"] == "", 60, "the balloon deflated")
    assert wait_for(lambda: agreed_slice(cluster, WIDE) == {"numa-0": 2}, 60, "the NUMA node published again")


def test_the_static_policy_offers_its_numa_nodes(cluster: Cluster) -> None:
    # The wide node's own configuration: static, no CPU reserved, so its default set keeps one CPU.
    wide = cluster.nodes[WIDE]
    with cluster.own_policy(WIDE, {"Active": "static"}):
        assert wait_for(lambda: agreed_slice(cluster, WIDE) == {"numa-0": 1}, 60, "the static devices published")
        make_claim(cluster, "static-one", "1")
        submit_claiming(cluster, "dra-static", "static-one", node=WIDE)
        cluster.placed("dra-static", WIDE)
        [held] = status_doc(cluster.config_socket(WIDE))["dra"]["claims"]
        assert wide.cpus("dra-static") == {"c0": CPUSet.parse(held["cpus"])} and len(CPUSet.parse(held["cpus"])) == 1
        # A best-effort pod runs on the default set, which no longer has the claim's CPU.
        wide.run("static-shared")
        assert wide.cpus("static-shared")["c0"].isdisjoint(CPUSet.parse(held["cpus"]))
        wide.delete("static-shared", 60)
        wide.delete("dra-static", 60)
        cluster.custom.delete_namespaced_custom_object(*CLAIMS, "static-one")
        wait_for(lambda: not status_doc(cluster.config_socket(WIDE))["dra"]["claims"], 60, "the claim unprepared")
    assert wait_for(lambda: agreed_slice(cluster, WIDE) == {"numa-0": 2}, 60, "topology-aware's devices again")


def test_the_static_policy_offers_each_cpu(cluster: Cluster) -> None:
    # The wide node's own configuration: static offering a device per CPU (dra-driver-cpu's
    # individual mode); a claim for CPU 1 by its attribute gets CPU 1, the default set keeps CPU 0.
    wide = cluster.nodes[WIDE]
    with cluster.own_policy(WIDE, {"Active": "static", "static": {"DRADevices": "cpu"}}):
        assert wait_for(lambda: agreed_slice(cluster, WIDE) == {"cpu-0": 1, "cpu-1": 1}, 60, "a device per CPU")
        make_claim(cluster, "static-cpu", kind="cpu", where="cpuID == 1")
        submit_claiming(cluster, "dra-cpu", "static-cpu", node=WIDE)
        cluster.placed("dra-cpu", WIDE)
        [held] = status_doc(cluster.config_socket(WIDE))["dra"]["claims"]
        assert (held["device"], held["cpus"]) == ("cpu-1", "1")
        assert wide.cpus("dra-cpu") == {"c0": CPUSet((1,))}
        # CPU 0 cannot be given now (the default set keeps it), CPU 1 still counts as its device's.
        assert wait_for(lambda: agreed_slice(cluster, WIDE) == {"cpu-0": 0, "cpu-1": 1}, 60, "CPU 0 kept")
        wide.delete("dra-cpu", 60)
        cluster.custom.delete_namespaced_custom_object(*CLAIMS, "static-cpu")
        wait_for(lambda: not status_doc(cluster.config_socket(WIDE))["dra"]["claims"], 60, "the claim unprepared")
    assert wait_for(lambda: agreed_slice(cluster, WIDE) == {"numa-0": 2}, 60, "topology-aware's devices again")


def test_podpools_offers_its_pool_instances(cluster: Cluster) -> None:
    # The wide node's own configuration: podpools with one instance of one CPU for one pod.
    pools = [{"Name": "solo", "Instances": 1, "CPU": 1, "MaxPods": 1}]
    wide = cluster.nodes[WIDE]
    with cluster.own_policy(WIDE, {"Active": "podpools", "podpools": {"Pools": pools}}):
        assert wait_for(lambda: agreed_slice(cluster, WIDE) == {"solo-0": 1}, 60, "the instance published")
        make_claim(cluster, "solo", kind="podpool")
        submit_claiming(cluster, "dra-podpool", "solo", node=WIDE)
        cluster.placed("dra-podpool", WIDE)
        [held] = status_doc(cluster.config_socket(WIDE))["dra"]["claims"]
        assert held["device"] == "solo-0"
        assert wide.cpus("dra-podpool") == {"c0": CPUSet.parse(held["cpus"])} and len(CPUSet.parse(held["cpus"])) == 1
        wide.delete("dra-podpool", 60)
        cluster.custom.delete_namespaced_custom_object(*CLAIMS, "solo")
        wait_for(lambda: not status_doc(cluster.config_socket(WIDE))["dra"]["claims"], 60, "the claim unprepared")
    assert wait_for(lambda: agreed_slice(cluster, WIDE) == {"numa-0": 2}, 60, "topology-aware's devices again")


def test_an_extended_resource_gets_a_device_without_a_claim(cluster: Cluster) -> None:
    # A pod asking for one of the DeviceClass's extended resource: kube-scheduler makes and allocates
    # a claim for it, kubelet has cri-resmgr prepare it, and the container runs on the device's CPUs.
    manifest = pod_manifest("dra-extended", "")
    del manifest["spec"]["nodeName"]
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": WIDE}
    manifest["spec"]["containers"][0]["resources"] = {"limits": {EXTENDED: "1"}}
    cluster.core.create_namespaced_pod(NAMESPACE, manifest)
    pod = cluster.placed("dra-extended", WIDE)
    assert not pod.spec.resource_claims
    wide = cluster.nodes[WIDE]
    assert wide.cpus("dra-extended") == {"c0": CPUSet.parse("0-1")}
    [held] = status_doc(cluster.config_socket(WIDE))["dra"]["claims"]
    assert (held["device"], held["cpus"]) == ("numa-0", "0-1")
    made = cluster.custom.list_namespaced_custom_object(*CLAIMS)["items"]
    assert [c["metadata"]["name"] for c in made if any(
        o["name"] == "dra-extended" for o in c["metadata"].get("ownerReferences", []))] == [held["name"]]

    # The pod gone, its claim goes with it and the CPUs are back.
    wide.delete("dra-extended", 60)
    wait_for(lambda: not status_doc(cluster.config_socket(WIDE))["dra"]["claims"], 60, "the claim unprepared")


# -- DRA: CPUs aligned with another driver's device -----------------------------------------------
def test_cpus_aligned_with_another_drivers_device(cluster: Cluster) -> None:
    nic_class(cluster)
    # The split node's NICs are both on its NUMA node 1, the wide node's on its only NUMA node.
    drivers = [nic_driver(cluster, SPLIT, **{"nic-0": 1, "nic-1": 1}), nic_driver(cluster, WIDE, **{"nic-0": 0})]
    claims = ("aligned-one", "aligned-two", "unaligned")
    try:
        # One CPU with a NIC on the split node: the CPU of the NIC's NUMA node, not the first one.
        make_aligned_claim(cluster, "aligned-one", "1")
        submit_claiming(cluster, "dra-nic-one", "aligned-one", node=SPLIT)
        cluster.placed("dra-nic-one", SPLIT)
        assert allocated(cluster, "aligned-one") == {"cpus": "numa-1", "nic": "nic-0"}
        assert cluster.nodes[SPLIT].cpus("dra-nic-one") == {"c0": CPUSet.parse("1")}
        assert "prepare default/aligned-one nic-0" in drivers[0].log()

        # Two CPUs with a NIC align only on the wide node (the split node's NUMA nodes have one CPU each).
        make_aligned_claim(cluster, "aligned-two", "2")
        submit_claiming(cluster, "dra-nic-two", "aligned-two")
        pod = cluster.placed("dra-nic-two", WIDE)
        assert pod.spec.node_name == WIDE
        assert cluster.nodes[WIDE].cpus("dra-nic-two") == {"c0": CPUSet.parse("0-1")}

        # The split node still has a free CPU (NUMA node 0) and a free NIC (NUMA node 1): they do not
        # align, so the pod waits with the scheduler's reason.
        make_aligned_claim(cluster, "unaligned", "1")
        submit_claiming(cluster, "dra-nic-unaligned", "unaligned", node=SPLIT)
        message = wait_for(lambda: cluster.unschedulable("dra-nic-unaligned"), 60, "the pod found unschedulable")
        assert "cannot allocate all claims" in message, message

        # The aligned pod gone, its CPU and NIC are free again: the waiting claim aligns on NUMA node 1.
        cluster.nodes[SPLIT].delete("dra-nic-one", 60)
        cluster.custom.delete_namespaced_custom_object(*CLAIMS, "aligned-one")
        cluster.placed("dra-nic-unaligned", SPLIT, 120)
        assert allocated(cluster, "unaligned")["cpus"] == "numa-1"
        assert cluster.nodes[SPLIT].cpus("dra-nic-unaligned") == {"c0": CPUSet.parse("1")}
        wait_for(lambda: "unprepare default/aligned-one" in drivers[0].log(), 60, "the NIC unprepared")
    finally:
        for pod, node in (("dra-nic-one", SPLIT), ("dra-nic-two", WIDE), ("dra-nic-unaligned", SPLIT)):
            with contextlib.suppress(client.ApiException):
                cluster.nodes[node].delete(pod, 60)
        for name in claims:
            with contextlib.suppress(client.ApiException):
                cluster.custom.delete_namespaced_custom_object(*CLAIMS, name)
        for proc in drivers:
            proc.stop()
        for node in (SPLIT, WIDE):
            with contextlib.suppress(client.ApiException):
                cluster.custom.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                            f"{node}-{NIC}")
        cluster.custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", NIC)
