"""Policies applied through the relay to the real containerd, read back from cgroups."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from resmgr.generated.cri import api_pb2 as cri
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.generate import generate, parse_spec
from resmgr.topology.sysfs import discover
from tests.support.helpers import (
    ONLINE,
    Cri,
    RelayProcess,
    cgroup_cpus,
    cgroup_cpuset,
    container_config,
    pod_config,
    policy_relay,
    resources,
    wait_until,
)

TOPOLOGY = discover("/")




@pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")
@pytest.mark.parametrize("policy", ["static", "topology-aware"])
def test_policy_pins_and_restores(containerd, workdir, direct, policy):
    relay = policy_relay(workdir, containerd.socket, policy).start()
    via = Cri(relay.socket)
    pods = []
    try:
        shared_cfg = pod_config(qos="burstable", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(shared_cfg))
        shared = via.run_container(pods[-1], shared_cfg, container_config(resources=resources(200, False)))
        assert cgroup_cpus(shared_cfg, shared) == ONLINE

        exclusive_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(exclusive_cfg))
        exclusive = via.run_container(pods[-1], exclusive_cfg, container_config(resources=resources(1000, True)))
        mine = cgroup_cpus(exclusive_cfg, exclusive)
        assert len(mine) == 1
        # The shared container was moved off the exclusive CPU in the runtime.
        assert cgroup_cpus(shared_cfg, shared) == ONLINE - mine
        if policy == "topology-aware":  # memory pinned to the pool's nodes
            mems = CPUSet(n.id for n in TOPOLOGY.memory_nodes() if n.cpus & mine)
            assert cgroup_cpuset(exclusive_cfg, exclusive, "mems") == mems

        # kill -9 and restart: every cgroup stays as it was.
        assert relay.stop(signal.SIGKILL) == -signal.SIGKILL
        via.close()
        relay = policy_relay(workdir, containerd.socket, policy, relay_dir=relay.relay_dir).start()
        via = Cri(relay.socket)
        assert cgroup_cpus(exclusive_cfg, exclusive) == mine
        assert cgroup_cpus(shared_cfg, shared) == ONLINE - mine

        # Removing the exclusive container gives its CPU back to the shared one.
        via.rt.StopContainer(cri.StopContainerRequest(container_id=exclusive, timeout=1), timeout=30)
        via.rt.RemoveContainer(cri.RemoveContainerRequest(container_id=exclusive), timeout=30)
        assert cgroup_cpus(shared_cfg, shared) == ONLINE
    finally:
        for p in pods:
            via.remove_pod(p)
        via.close()
        relay.stop()


@pytest.mark.parametrize("policy, message", [
    ("static", "default/{pod}/main needs 64 exclusive CPUs"),
    ("topology-aware", "container default/{pod}/main: no pool can take 64 exclusive CPU(s)"),
])
def test_request_that_cannot_fit_fails_create(containerd, workdir, policy, message):
    relay = policy_relay(workdir, containerd.socket, policy).start()
    via = Cri(relay.socket)
    try:
        import grpc

        cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pod = via.run_pod(cfg)
        with pytest.raises(grpc.RpcError) as info:
            via.create(pod, cfg, container_config(resources=resources(64000, True)))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert message.format(pod=cfg.metadata.name) in info.value.details()
        via.remove_pod(pod)
    finally:
        via.close()
        relay.stop()


@pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")
def test_containers_started_while_down_are_allocated(containerd, workdir, direct):
    relay = policy_relay(workdir, containerd.socket, "static").start()
    relay.stop()
    # Behind the relay's back: a Guaranteed 1-CPU container and a shared one, both unpinned.
    g_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
    s_cfg = pod_config(qos="besteffort", logdir=str(workdir / "logs"))
    pods = [direct.run_pod(g_cfg), direct.run_pod(s_cfg)]
    try:
        g = direct.run_container(pods[0], g_cfg, container_config(resources=resources(1000, True)))
        s = direct.run_container(pods[1], s_cfg, container_config(resources=resources(0, False)))
        assert cgroup_cpus(g_cfg, g) == ONLINE
        relay = policy_relay(workdir, containerd.socket, "static", relay_dir=relay.relay_dir).start()
        try:
            mine = cgroup_cpus(g_cfg, g)
            assert len(mine) == 1
            assert cgroup_cpus(s_cfg, s) == ONLINE - mine
        finally:
            relay.stop()
    finally:
        for p in pods:
            direct.remove_pod(p)


@pytest.mark.skipif(ONLINE != CPUSet.parse("0-1"), reason="the generated machine's CPUs must exist here")
def test_topology_aware_rebalance_moves_a_shared_container(containerd, workdir):
    # Two NUMA nodes of one CPU each (memory not pinned: node 1 does not exist here).
    root = generate(parse_spec("sockets=1,nodes=2,cores=1,threads=1"), workdir / "host")
    config = workdir / "ta.yaml"
    config.write_text("policy:\n  Active: topology-aware\n  topology-aware:\n    PinMemory: false\n")
    relay = RelayProcess(workdir, containerd.socket, "--force-config", str(config), "--host-root", str(root),
                         "--rebalance-interval", "200ms").start()
    via = Cri(relay.socket)
    pods = []
    try:
        g_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(g_cfg))
        g = via.run_container(pods[-1], g_cfg, container_config(resources=resources(1000, True)))
        assert cgroup_cpus(g_cfg, g) == CPUSet((0,))
        s_cfg = pod_config(qos="besteffort", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(s_cfg))
        s = via.run_container(pods[-1], s_cfg, container_config(resources=resources(0, False)))
        assert cgroup_cpus(s_cfg, s) == CPUSet((1,))  # the only pool with a shared CPU left
        via.remove_pod(pods.pop(0))
        # Both pools are free now; rebalancing moves the shared container to the first one.
        wait_until(lambda: cgroup_cpus(s_cfg, s) == CPUSet((0,)), what="the shared container moved to CPU 0")
    finally:
        for p in pods:
            via.remove_pod(p)
        via.close()
        relay.stop()


@pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")
def test_a_container_that_exits_on_its_own_gives_its_cpus_back(containerd, workdir):
    relay = policy_relay(workdir, containerd.socket, "static", "--reconcile-interval", "200ms").start()
    via = Cri(relay.socket)
    pods = []
    try:
        s_cfg = pod_config(qos="besteffort", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(s_cfg))
        shared = via.run_container(pods[-1], s_cfg, container_config(resources=resources(0, False)))
        job_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(job_cfg))
        # A job that runs a moment and exits; kubelet would leave it until the pod goes.
        via.run_container(pods[-1], job_cfg, container_config(command=["sleep", "1"],
                                                              resources=resources(1000, True)))
        assert len(ONLINE - cgroup_cpus(s_cfg, shared)) == 1  # the job holds a CPU
        wait_until(lambda: cgroup_cpus(s_cfg, shared) == ONLINE, what="the job's CPU is shared again")
    finally:
        for p in pods:
            via.remove_pod(p)
        via.close()
        relay.stop()


@pytest.mark.skipif(len(ONLINE) != 2, reason="counts on 2 CPUs: CPU 0 reserved, one left to share or hold")
@pytest.mark.parametrize("policy", ["topology-aware", "static-plus"])
def test_best_effort_runs_on_the_reserved_cpu_while_the_other_is_exclusive(containerd, workdir, direct, policy):
    """What a scheduler admits runs: with the only unreserved CPU held exclusively, a best-effort
    container is not refused; it runs on the reserved CPU, and moves back once that CPU is free."""
    relay = policy_relay(workdir, containerd.socket, policy, reserved="cpuset:0").start()
    via = Cri(relay.socket)
    pods = []
    try:
        g_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(g_cfg))
        g = via.run_container(pods[-1], g_cfg, container_config(resources=resources(1000, True)))
        assert cgroup_cpus(g_cfg, g) == CPUSet([1])
        be_cfg = pod_config(qos="besteffort", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(be_cfg))
        be = via.run_container(pods[-1], be_cfg, container_config(resources=resources(0, False)))
        assert cgroup_cpus(be_cfg, be) == CPUSet([0])
        assert relay.log().count("exclusive grants hold every shared CPU") == 1
        via.remove_pod(pods.pop(0))
        wait_until(lambda: cgroup_cpus(be_cfg, be) == CPUSet([1]), what="the best-effort container moves back")
        wait_until(lambda: "run on their pools' own shared CPUs again" in relay.log(), what="the end is logged")
    finally:
        for pod in pods:
            via.remove_pod(pod)
        via.close()
        relay.stop()


@pytest.mark.skipif(ONLINE != CPUSet.parse("0-1"), reason="the generated machine's CPUs must exist here")
def test_cpu_classes_follow_the_cpus_of_the_grants_and_go_back_with_them(containerd, workdir):
    """The daemon's CPU classes on a generated machine's cpufreq files: an exclusive grant's CPU in
    the exclusive class, back in the shared class when it goes, and as it was once no class holds it
    (a restart with a configuration without classes)."""
    root = generate(parse_spec("sockets=1,nodes=1,cores=2,threads=1"), workdir / "host")
    max_freq = str(root / "sys/devices/system/cpu/cpu{}/cpufreq/scaling_max_freq")
    config = workdir / "ta.yaml"
    config.write_text("policy:\n  Active: topology-aware\n  topology-aware:\n    PinMemory: false\n"
                      "    SharedPoolCPUClass: normal\n    DefaultExclusiveCPUClass: turbo\n"
                      "cpu:\n  Classes:\n    normal: {MaxFreq: 2000000}\n"
                      "    turbo: {MaxFreq: 3500000, MinFreq: 3000000}\n")
    relay = RelayProcess(workdir, containerd.socket, "--force-config", str(config), "--host-root", str(root)).start()
    via = Cri(relay.socket)
    pods = []
    try:
        wait_until(lambda: [Path(max_freq.format(c)).read_text().strip() for c in (0, 1)] == ["2000000"] * 2,
                   what="every CPU in the shared class")
        g_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(g_cfg))
        g = via.run_container(pods[-1], g_cfg, container_config(resources=resources(1000, True)))
        cpu = min(cgroup_cpus(g_cfg, g))
        wait_until(lambda: Path(max_freq.format(cpu)).read_text().strip() == "3500000", what="the turbo class")
        via.remove_pod(pods.pop())
        wait_until(lambda: Path(max_freq.format(cpu)).read_text().strip() == "2000000", what="the shared class again")
    finally:
        for p in pods:
            via.remove_pod(p)
        via.close()
        relay.stop()
    config.write_text("policy:\n  Active: topology-aware\n  topology-aware:\n    PinMemory: false\n")
    relay = RelayProcess(workdir, containerd.socket, "--force-config", str(config), "--host-root", str(root)).start()
    try:
        wait_until(lambda: [Path(max_freq.format(c)).read_text().strip() for c in (0, 1)] == ["3900000"] * 2,
                   what="the CPUs as they were before any class")
    finally:
        relay.stop()
