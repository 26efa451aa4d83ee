"""cri-resmgr under a real kubelet of a real API server (harness.kube): pods made through the API run
with the policy's CPUs, in relay mode (both front ends) and in NRI mode, and kubelet sees nothing it
would not see talking to containerd directly."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from resmgr.topology.cpuset import CPUSet
from tests.helpers import ONLINE, wait_until
from tests.kubenode import KubeNode, error_kinds

pytestmark = pytest.mark.skipif(len(ONLINE) < 2, reason="needs two CPUs: one reserved, one to hand out")

RESERVED = CPUSet([0])
# The optional CRI paths kubelet takes with these on: the container event stream (evented PLEG) and
# pod and container statistics from the runtime instead of cAdvisor.
PERIODIC = {"Version", "Status", "RuntimeConfig", "ListPodSandbox", "ListContainers", "PodSandboxStatus",
            "ContainerStatus", "ListPodSandboxStats", "ImageFsInfo", "ImageStatus"}
GATES = {"featureGates": {"EventedPLEG": True, "PodAndContainerStatsFromCRI": True}}


def scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="crirm-"))


def done_with(path: Path) -> None:
    if not os.environ.get("CRIRM_KEEP_WORKDIR"):
        shutil.rmtree(path, ignore_errors=True)


def qos_round(node: KubeNode) -> tuple[dict[str, CPUSet], dict[str, CPUSet]]:
    """A pod of each QoS class through the API, kubelet's periodic calls on them, the Guaranteed one
    deleted: (CPUs of each while all ran, CPUs of the others after)."""
    node.run("besteffort")
    node.run("burstable", cpu="200m", memory="32Mi")
    node.run("guaranteed", cpu="1", memory="64Mi", limits=True)
    placed = {name: node.cpus(name)["c0"] for name in ("besteffort", "burstable", "guaranteed")}
    # Statistics (CRI stats with the gate on) as `kubectl top` would ask, and time for the periodic
    # calls: pod and container status, relists, node status.
    summary = json.loads(node.control.get(f"/api/v1/nodes/{node.node}/proxy/stats/summary"))
    assert {p["podRef"]["name"] for p in summary["pods"]} >= {"besteffort", "burstable", "guaranteed"}
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
    assert error_kinds(log) - direct_errors == set(), "kubelet errors seen only through cri-resmgr"
    # The event stream reached the kubelet and stayed up.
    assert "Received Container Started Event" in log and "Fall back to Generic PLEG" not in log
    if front != "nri":
        made = re.findall(r"(?:passthrough|intercepted) (\w+) (ok|error \w+)", calls)
        assert {m for m, _ in made} >= PERIODIC, "kubelet's periodic calls went through the relay"
        assert [c for c in made if c[1] != "ok"] == [], "a kubelet call failed through the relay"
