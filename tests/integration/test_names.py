"""Creates that collide with a container the runtime already holds the name for, against the real
containerd: what kubelet does after a call was cut off (the relay killed after containerd made the
container, before it answered). Nothing may be released because a create merely asks for a name."""

from __future__ import annotations

import signal
import time

import grpc
import pytest

from resmgr.generated.cri import api_pb2 as cri
from resmgr.topology.cpuset import CPUSet
from tests.support.helpers import (
    GUARANTEED_CPU,
    ONLINE,
    SHARED,
    Cri,
    Pods,
    cgroup_cpus,
    container_config,
    pod_config,
    policy_relay,
    wait_until,
)

pytestmark = [
    pytest.mark.skipif(len(ONLINE) != 2, reason="counts on 2 CPUs: one exclusive grant fills the machine"),
]


@pytest.fixture
def slow_relay(containerd, workdir, relay_mode):
    """A static relay whose reconciliation rounds are far apart, so only the lifecycle calls decide."""
    relay = policy_relay(workdir, containerd.socket, "static", "--relay-mode", relay_mode,
                         "--reconcile-interval", "60s").start()
    yield relay
    if relay.proc is not None and relay.proc.poll() is None:
        relay.stop()


@pytest.fixture
def through(slow_relay, workdir):
    """A client of the relay, its pods (removed at the end), and a best-effort container that sees
    every change of the shared CPUs: (client, pods, its pod config, its ID)."""
    via = Cri(slow_relay.socket)
    pods = Pods(via, workdir)
    s_cfg, _, shared = pods.run("besteffort", SHARED)
    yield via, pods, s_cfg, shared
    pods.remove_all()
    via.close()


def _made_while_down(relay, direct: Cri, pods: Pods, workdir):
    """A Guaranteed container that containerd made (on CPU 1, as the relay had decided) while the relay
    was killed before it answered; the relay back, it has been adopted. Returns what a retry needs."""
    cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
    pod = pods.client.run_pod(cfg)
    pods.ids.append(pod)
    relay.stop(signal.SIGKILL)
    exclusive = max(ONLINE)
    made = container_config(resources=GUARANTEED_CPU)
    made.linux.resources.cpuset_cpus = str(exclusive)
    cid = direct.create(pod, cfg, made)
    relay.start()
    return cfg, pod, cid, exclusive


def test_a_retried_create_refused_for_its_name_leaves_the_holder_its_cpu(direct, slow_relay, through, workdir):
    via, pods, s_cfg, shared = through
    cfg, pod, holder, exclusive = _made_while_down(slow_relay, direct, pods, workdir)
    wait_until(lambda: cgroup_cpus(s_cfg, shared) == ONLINE - CPUSet([exclusive]),
               what="the adopted container's CPU is taken out of the shared ones")
    # kubelet's retry of the create that was cut off: the same name and attempt.
    with pytest.raises(grpc.RpcError) as info:
        via.create(pod, cfg, container_config(resources=GUARANTEED_CPU))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f'is reserved for "{holder}"' in info.value.details()
    via.start(holder)  # the container the error names
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:  # no reconciliation round comes to repair anything
        assert cgroup_cpus(cfg, holder) == CPUSet([exclusive])
        assert exclusive not in cgroup_cpus(s_cfg, shared), "the exclusive CPU is shared"
        time.sleep(0.1)
    assert "allocating it again" not in slow_relay.log()
    # Once it is removed (a confirmed removal), its CPU is the shared containers' again.
    via.rt.StopContainer(cri.StopContainerRequest(container_id=holder, timeout=0), timeout=30)
    via.rt.RemoveContainer(cri.RemoveContainerRequest(container_id=holder), timeout=30)
    wait_until(lambda: cgroup_cpus(s_cfg, shared) == ONLINE, what="the CPU is given back")


def test_a_retried_create_accepted_once_the_holder_is_gone_takes_its_cpu(direct, slow_relay, through, workdir):
    via, pods, s_cfg, shared = through
    cfg, pod, holder, exclusive = _made_while_down(slow_relay, direct, pods, workdir)
    wait_until(lambda: cgroup_cpus(s_cfg, shared) == ONLINE - CPUSet([exclusive]), what="adopted")
    direct.rt.RemoveContainer(cri.RemoveContainerRequest(container_id=holder), timeout=30)  # behind our back
    cid = via.create(pod, cfg, container_config(resources=GUARANTEED_CPU))
    via.start(cid)
    assert len(cgroup_cpus(cfg, cid)) == 1
    assert cgroup_cpus(s_cfg, shared) == ONLINE - cgroup_cpus(cfg, cid)


def test_an_older_attempt_still_running_keeps_its_cpu(direct, through, workdir):
    """A create of the next attempt does not release the previous one while the runtime runs it."""
    via, pods, s_cfg, shared = through
    cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
    pod = via.run_pod(cfg)
    pods.ids.append(pod)
    first = via.run_container(pod, cfg, container_config(resources=GUARANTEED_CPU))
    again = container_config(resources=GUARANTEED_CPU)
    again.metadata.attempt = 1
    with pytest.raises(grpc.RpcError) as info:  # no room for a second exclusive CPU
        via.create(pod, cfg, again)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert cgroup_cpus(s_cfg, shared) == ONLINE - cgroup_cpus(cfg, first)
    # Once the runtime shows the first attempt gone, the next one gets its CPU.
    direct.rt.StopContainer(cri.StopContainerRequest(container_id=first, timeout=0), timeout=30)
    second = wait_until(lambda: _try_create(via, pod, cfg, again), what="the next attempt is created")
    via.start(second)
    assert len(cgroup_cpus(cfg, second)) == 1


def _try_create(via: Cri, pod: str, cfg: cri.PodSandboxConfig, config: cri.ContainerConfig) -> str:
    try:
        return via.create(pod, cfg, config)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
        return ""


def test_an_older_attempt_never_started_gives_its_cpu_to_the_next(direct, through, workdir):
    """kubelet makes the next attempt when the last one is created but not running, and never starts
    that one: the new attempt gets the CPU, and the old one waits on the shared CPUs."""
    via, pods, s_cfg, shared = through
    cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
    pod = via.run_pod(cfg)
    pods.ids.append(pod)
    first = via.create(pod, cfg, container_config(resources=GUARANTEED_CPU))
    exclusive = spec_cpus(direct, first)  # created, not started: no cgroup yet
    assert len(exclusive) == 1
    again = container_config(resources=GUARANTEED_CPU)
    again.metadata.attempt = 1
    second = via.create(pod, cfg, again)
    via.start(second)
    assert cgroup_cpus(cfg, second) == exclusive
    wait_until(lambda: spec_cpus(direct, first) == ONLINE - exclusive, what="the old attempt is on the shared CPUs")
    assert cgroup_cpus(s_cfg, shared) == ONLINE - exclusive
    via.start(first)  # started after all: it runs on the shared CPUs
    assert cgroup_cpus(cfg, first) == ONLINE - exclusive


def spec_cpus(direct: Cri, cid: str) -> CPUSet:
    """The cpuset a container is to run with, as the runtime reports it."""
    st = direct.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=cid), timeout=10).status
    return CPUSet.parse(st.resources.linux.cpuset_cpus)
