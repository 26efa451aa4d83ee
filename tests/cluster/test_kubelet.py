"""cri-resmgr under a real kubelet of a real API server (harness.kube): pods made through the API run
with the policy's CPUs, in relay mode (both front ends) and in NRI mode, and kubelet sees nothing it
would not see talking to containerd directly."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from harness.kube import container_ids
from resmgr.generated.cri import api_pb2 as cri
from resmgr.topology.cpuset import CPUSet
from tests.support.helpers import ONLINE, resmgr_status, wait_until
from tests.support.kubenode import KubeNode, done_with, error_kinds, scratch

pytestmark = [
    pytest.mark.skipif(len(ONLINE) < 2, reason="needs two CPUs: one reserved, one to hand out"),
]

RESERVED = CPUSet([0])
# kubelet's calls that must go through the relay, answered ok, in every round.
PERIODIC = {"Version", "Status", "RuntimeConfig", "ListPodSandbox", "ListContainers", "PodSandboxStatus",
            "ContainerStatus", "ListPodSandboxStats", "ImageFsInfo", "ImageStatus"}
# The optional CRI paths kubelet takes with these on: the container event stream (evented PLEG) and
# pod and container statistics from the runtime instead of cAdvisor.
GATES = {"featureGates": {"EventedPLEG": True, "PodAndContainerStatsFromCRI": True}}


def qos_round(node: KubeNode) -> tuple[dict[str, CPUSet], dict[str, CPUSet]]:
    """A pod of each QoS class through the API, kubelet's periodic calls on them, the Guaranteed one
    deleted: (CPUs of each while all ran, CPUs of the others after)."""
    node.run("besteffort")
    node.run("burstable", cpu="200m", memory="32Mi")
    node.run("guaranteed", cpu="1", memory="64Mi", limits=True)
    placed = {name: node.cpus(name)["c0"] for name in ("besteffort", "burstable", "guaranteed")}
    # Statistics (CRI stats with the gate on) as `kubectl top` would ask, and time for the periodic
    # calls: pod and container status, relists, node status.
    def summarized() -> bool:
        summary = json.loads(node.control.get(f"/api/v1/nodes/{node.node}/proxy/stats/summary"))
        return {p["podRef"]["name"] for p in summary["pods"]} >= {"besteffort", "burstable", "guaranteed"}

    wait_until(summarized, timeout=30, interval=1, what="the three pods in kubelet's statistics")
    node.delete("guaranteed")

    def others() -> dict[str, CPUSet]:
        return {name: node.cpus(name)["c0"] for name in ("besteffort", "burstable")}

    if node.front != "direct":
        wait_until(lambda: all(c == ONLINE for c in others().values()), timeout=20,
                   what="the Guaranteed pod's CPU given back")
    after = others()
    node.delete("besteffort")
    node.delete("burstable")
    return placed, after


@pytest.fixture(scope="module")
def direct_errors(kube) -> set[str]:
    """What kubelet logs as errors for the same pods talking to containerd directly."""
    where = scratch()
    node = KubeNode(kube, where, front="direct", **GATES).start()
    try:
        qos_round(node)
        return error_kinds(node.kubelet.log())
    finally:
        node.stop()
        done_with(where)


@pytest.mark.parametrize("front", ["splice", "grpc", "nri"])
def test_pods_of_each_qos_class_run_with_the_policys_cpus(kube, direct_errors, front):
    where = scratch()
    if front == "nri":
        node = KubeNode(kube, where, front="nri", **GATES)
    else:
        node = KubeNode(kube, where, front="relay", relay_mode=front, **GATES)
    node.start()  # the node is Ready through cri-resmgr
    try:
        placed, after = qos_round(node)
        log = node.kubelet.log()
        calls = node.resmgr.log() if front != "nri" else ""
    finally:
        node.stop()
        done_with(where)
    exclusive = ONLINE - RESERVED
    assert placed["guaranteed"] == exclusive
    assert placed["besteffort"] == placed["burstable"] == ONLINE - exclusive
    assert after == {"besteffort": ONLINE, "burstable": ONLINE}
    extra = error_kinds(log) - direct_errors
    assert extra == set(), "kubelet errors seen only through cri-resmgr:\n" + "\n".join(
        line for line in log.splitlines() if any(kind.split(" ", 1)[0] in line for kind in extra))
    # The event stream reached the kubelet and stayed up (kubelet 1.37 logs the relists that the
    # events of ended containers ask for, and each retry of a broken stream).
    assert "Evented PLEG: requested pod relist after container termination" in log
    assert "failed to get container events" not in log
    if front != "nri":
        made = re.findall(r"(?:passthrough|intercepted) (\w+) (ok|error \w+)", calls)
        assert {m for m, _ in made} >= PERIODIC, "kubelet's periodic calls went through the relay"
        # kubelet 1.37 also asks for the stats of sandbox "", which containerd refuses without the
        # relay too ("prefix can't be empty").
        own = len(re.findall(r"passthrough PodSandboxStats error UNKNOWN: [^\n]*prefix can't be empty", calls))
        failed = [c for c in made if c[1] != "ok"]
        assert failed == [("PodSandboxStats", "error UNKNOWN")] * own, "a kubelet call failed through the relay"


@pytest.mark.parametrize("cpu_manager", ["none", "static"])
def test_what_kubelets_cpu_manager_does_to_the_pinning(kube, cpu_manager):
    """cri-resmgr reserves CPU 1 and kubelet's static CPU manager CPU 0, so the two disagree on every
    Guaranteed container: whose CPUs does it run on, and how often does kubelet push its own?"""
    where = scratch()
    node = KubeNode(kube, where, reserved="cpuset:1", cpu_manager=cpu_manager, cpuManagerReconcilePeriod="2s")
    node.start()
    try:
        node.run("guaranteed", cpu="1", memory="64Mi", limits=True)
        node.run("besteffort")
        time.sleep(10)  # five of kubelet's CPU manager reconciliation periods
        seen = {name: node.cpus(name)["c0"] for name in ("guaranteed", "besteffort")}
        assert node.resmgr is not None
        updates = len(re.findall(r"intercepted UpdateContainerResources", node.resmgr.log()))
        kubelet_state = (node.kubelet.root / "cpu_manager_state").read_text()
        # A CPU resize of the Guaranteed pod through the API: does kubelet pass it on?
        node.core.patch_namespaced_pod_resize("guaranteed", "default", {"spec": {"containers": [
            {"name": "c0", "resources": {"requests": {"cpu": "500m", "memory": "64Mi"},
                                         "limits": {"cpu": "500m", "memory": "64Mi"}}}]}})
        resized = wait_until(lambda: resize_outcome(node, "guaranteed", "500m"), timeout=30,
                             what="kubelet to apply or refuse the resize")
    finally:
        node.stop()
        done_with(where)
    print(f"\ncpu manager {cpu_manager}: guaranteed on {seen['guaranteed']}, best-effort on {seen['besteffort']}, "
          f"{updates} UpdateContainerResources from kubelet in 10 s; kubelet's state {kubelet_state.strip()}; "
          f"a resize to 500m: {resized}")
    # cri-resmgr's placement holds either way: the Guaranteed container keeps CPU 0 of its own.
    assert seen == {"guaranteed": CPUSet([0]), "besteffort": CPUSet([1])}
    if cpu_manager == "none":
        assert updates == 0 and resized == "applied"
    else:  # kubelet's own record disagrees with the node, and it holds CPU resizes back
        assert json.loads(kubelet_state)["defaultCpuSet"] == "0" and resized.startswith("PodResizePending")


def resize_outcome(node: KubeNode, name: str, cpu: str) -> str:
    """'applied' once the pod's status shows the new CPU limit, or the PodResizePending condition
    (with its reason) kubelet sets when it will not apply it; "" while neither."""
    pod = node.core.read_namespaced_pod(name, "default")
    limits = pod.status.container_statuses[0].resources.limits or {}
    if limits.get("cpu") == cpu:
        return "applied"
    for cond in pod.status.conditions or []:
        if cond.type == "PodResizePending" and cond.status == "True":
            return f"PodResizePending {cond.reason}: {cond.message}"
    return ""


@pytest.mark.parametrize("front", ["relay", "nri"])
def test_an_in_place_resize_through_the_api_reallocates(kube, front):
    """A Guaranteed pod resized from half a CPU (shared) to a whole one (exclusive) and back, through
    the API's resize subresource: kubelet's UpdateContainerResources reaches the policy."""
    where = scratch()
    node = KubeNode(kube, where, front=front)
    node.start()

    def resize(cpu: str) -> None:
        node.core.patch_namespaced_pod_resize("g", "default", {"spec": {"containers": [
            {"name": "c0", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"},
                                         "limits": {"cpu": cpu, "memory": "64Mi"}}}]}})

    def applied(cpu: str) -> bool:
        st = node.core.read_namespaced_pod("g", "default").status.container_statuses[0]
        return bool(st.resources and st.resources.limits and st.resources.limits.get("cpu") == cpu)

    try:
        node.run("g", cpu="500m", memory="64Mi", limits=True)
        node.run("other")
        assert node.cpus("g")["c0"] == ONLINE  # half a CPU: shared, and CPU 0 is not held back yet
        resize("1")
        wait_until(lambda: applied("1"), timeout=30, what="kubelet to apply the resize")
        wait_until(lambda: node.cpus("g")["c0"] == ONLINE - RESERVED, timeout=15, what="an exclusive CPU")
        assert node.cpus("other")["c0"] == RESERVED
        resize("500m")
        wait_until(lambda: applied("500m"), timeout=30, what="kubelet to apply the shrink")
        wait_until(lambda: node.cpus("g")["c0"] == ONLINE and node.cpus("other")["c0"] == ONLINE, timeout=15,
                   what="the CPU given back")
        assert node.restarts() == {"g": 0, "other": 0}
    finally:
        node.stop()
        done_with(where)


def known(node: KubeNode) -> tuple[int, int]:
    """(pods, containers) cri-resmgr holds."""
    st = resmgr_status(str(node.workdir / "config.sock"))
    return st.pods, st.containers


@pytest.mark.parametrize("front", ["relay", "nri"])
def test_restarts_under_running_pods(kube, front):
    """kubelet, cri-resmgr (SIGKILL) and containerd (SIGKILL) restarted in turn under running pods: no
    container restarted, the exclusive CPU never shared, and nothing left once the pods are deleted."""
    where = scratch()
    node = KubeNode(kube, where, front=front)
    node.start()
    try:
        names = ("guaranteed", "burstable", "besteffort")
        node.run("guaranteed", cpu="1", memory="64Mi", limits=True)
        node.run("burstable", cpu="200m")
        node.run("besteffort")
        ids = {n: container_ids(node.core.read_namespaced_pod(n, "default")) for n in names}
        placed = {n: node.cpus(n)["c0"] for n in names}
        assert placed["guaranteed"] == ONLINE - RESERVED and placed["besteffort"] == RESERVED
        assert node.resmgr is not None
        for what in ("kubelet", "cri-resmgr", "containerd"):
            if what == "kubelet":
                node.kubelet.kill()
                node.kubelet.start()
            elif what == "cri-resmgr":
                node.resmgr.stop(signal.SIGKILL)
                node.resmgr.start()
            else:
                node.ctrd.kill()
                node.ctrd.start()
                if front == "nri":
                    node.resmgr.wait_synchronized()
            node.kubelet.wait_ready()
            time.sleep(5)  # kubelet's sync loop and PLEG look at every pod again
            for n in names:
                node.wait_running(n)
            assert {n: container_ids(node.core.read_namespaced_pod(n, "default")) for n in names} == ids, what
            assert {n: node.cpus(n)["c0"] for n in names} == placed, f"after restarting {what}"
        assert set(node.restarts().values()) == {0}
        assert known(node) == (3, 3)
        for n in names:
            node.delete(n)
        # kubelet removes what it stopped only at its next garbage collection (every minute): until then
        # cri-resmgr knows exactly what containerd still has, and nothing of it runs.
        assert node.direct is not None
        left = node.direct.rt.ListContainers(cri.ListContainersRequest(), timeout=10).containers
        sandboxes = node.direct.rt.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=10).items
        assert [c for c in left if c.state == cri.CONTAINER_RUNNING] == []
        assert known(node) == (len(sandboxes), len(left))
    finally:
        node.stop()
        done_with(where)
