"""In-place resize, kubelet's CPU manager and container events, against the real containerd.

On 2 CPUs with the static policy: a Guaranteed 1-CPU container holds one CPU exclusively and
shared containers run on the other.
"""

from __future__ import annotations

import time

import grpc
import pytest

from resmgr.generated.cri import api_pb2 as cri
from tests.support.helpers import (
    GUARANTEED_CPU,
    ONLINE,
    SHARED,
    Cri,
    Pods,
    cgroup_cpus,
    policy_relay,
    wait_until,
)

pytestmark = [
    pytest.mark.skipif(len(ONLINE) != 2, reason="counts on 2 CPUs: one exclusive grant fills the machine"),
]

HALF_CPU = cri.LinuxContainerResources(cpu_shares=512, cpu_quota=50000, cpu_period=100000,
                                       memory_limit_in_bytes=64 << 20)
TWO_CPUS = cri.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000,
                                       memory_limit_in_bytes=64 << 20)


@pytest.fixture(params=["static", "topology-aware"])
def node(request, containerd, workdir, relay_mode):
    # Reconciliation every 60 s: whatever happens sooner was done by events or by the call itself.
    relay = policy_relay(workdir, containerd.socket, request.param, "--relay-mode", relay_mode,
                         "--reconcile-interval", "60s").start()
    via = Cri(relay.socket)
    pods = Pods(via, workdir)
    yield relay, via, pods
    pods.remove_all()
    via.close()
    relay.stop()


def resize(via: Cri, cid: str, res: cri.LinuxContainerResources) -> None:
    via.rt.UpdateContainerResources(cri.UpdateContainerResourcesRequest(container_id=cid, linux=res), timeout=30)


def test_resize_moves_a_container_between_exclusive_and_shared_cpus(node):
    relay, via, pods = node
    s_cfg, _, shared = pods.run("besteffort", SHARED)
    g_cfg, _, guaranteed = pods.run("guaranteed", GUARANTEED_CPU)
    mine = cgroup_cpus(g_cfg, guaranteed)
    assert len(mine) == 1 and cgroup_cpus(s_cfg, shared) == ONLINE - mine

    resize(via, guaranteed, HALF_CPU)  # a fraction of a CPU: no longer exclusive
    assert cgroup_cpus(g_cfg, guaranteed) == ONLINE
    assert cgroup_cpus(s_cfg, shared) == ONLINE  # moved as part of the call, not later

    resize(via, guaranteed, GUARANTEED_CPU)  # one whole CPU again: exclusive again
    again = cgroup_cpus(g_cfg, guaranteed)
    assert len(again) == 1 and cgroup_cpus(s_cfg, shared) == ONLINE - again
    assert "resized" in relay.log()


def test_a_resize_the_policy_cannot_meet_is_refused_and_changes_nothing(node):
    relay, via, pods = node
    s_cfg, _, shared = pods.run("besteffort", SHARED)
    g_cfg, _, guaranteed = pods.run("guaranteed", GUARANTEED_CPU)
    before = cgroup_cpus(g_cfg, guaranteed), cgroup_cpus(s_cfg, shared)
    with pytest.raises(grpc.RpcError) as info:  # two exclusive CPUs would leave shared ones none
        resize(via, guaranteed, TWO_CPUS)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "exclusive" in info.value.details() or "CPU" in info.value.details()
    assert (cgroup_cpus(g_cfg, guaranteed), cgroup_cpus(s_cfg, shared)) == before
    status = via.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=guaranteed), timeout=10)
    assert status.status.resources.linux.cpu_quota == GUARANTEED_CPU.cpu_quota
    # and the policy still holds what it held: a shrink works from there
    resize(via, guaranteed, HALF_CPU)
    assert cgroup_cpus(s_cfg, shared) == ONLINE


def test_cpu_manager_updates_never_undo_pinning(node):
    relay, via, pods = node
    s_cfg, _, shared = pods.run("besteffort", SHARED)
    g_cfg, _, guaranteed = pods.run("guaranteed", GUARANTEED_CPU)
    mine = cgroup_cpus(g_cfg, guaranteed)
    # kubelet's CPU manager (policy none) re-sends the whole machine as every container's cpuset.
    for cid in (guaranteed, shared):
        resize(via, cid, cri.LinuxContainerResources(cpuset_cpus=str(ONLINE)))
    assert cgroup_cpus(g_cfg, guaranteed) == mine
    assert cgroup_cpus(s_cfg, shared) == ONLINE - mine
    assert relay.log().count("changes nothing; answered without the runtime") == 2
    # The container's request is kept: a later resize starts from it, not from zeros.
    status = via.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=guaranteed), timeout=10)
    assert status.status.resources.linux.cpu_quota == GUARANTEED_CPU.cpu_quota
    # A field the policy does not decide is forwarded, with the pinning kept.
    resize(via, shared, cri.LinuxContainerResources(cpuset_cpus=str(ONLINE), cpu_shares=4))
    status = via.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=shared), timeout=10)
    assert status.status.resources.linux.cpu_shares == 4
    assert cgroup_cpus(s_cfg, shared) == ONLINE - mine


def test_an_exited_container_gives_its_cpu_back_at_once(node):
    relay, via, pods = node
    s_cfg, _, shared = pods.run("besteffort", SHARED)
    g_cfg, _, guaranteed = pods.run("guaranteed", GUARANTEED_CPU, command=["sh", "-c", "sleep 1"])
    assert len(cgroup_cpus(g_cfg, guaranteed)) == 1
    wait_until(lambda: via.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=guaranteed),
                                              timeout=10).status.state == cri.CONTAINER_EXITED,
               what="the Guaranteed container exits by itself")
    exited = time.monotonic()
    wait_until(lambda: cgroup_cpus(s_cfg, shared) == ONLINE, timeout=10, interval=0.01,
               what="the shared container gets the CPU back long before reconciliation would")
    assert time.monotonic() - exited < 5
    assert "following the runtime's container events" in relay.log()
