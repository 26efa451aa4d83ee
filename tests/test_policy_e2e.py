"""Policies applied through the relay to the real containerd, read back from cgroups."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from resmgr.cri import api_pb2 as cri
from resmgr.requirements import milli_to_shares
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.sysfs import discover
from tests.helpers import Cri, RelayProcess, container_config, pod_config

ONLINE = discover("/").online


def cgroup_cpus(pod: cri.PodSandboxConfig, cid: str) -> CPUSet:
    base = Path("/sys/fs/cgroup/cpuset") / pod.linux.cgroup_parent.lstrip("/") / cid / "cpuset.cpus"
    if not base.exists():  # cgroup v2
        base = Path("/sys/fs/cgroup") / pod.linux.cgroup_parent.lstrip("/") / cid / "cpuset.cpus"
    return CPUSet.parse(base.read_text())


def resources(milli: int, guaranteed: bool) -> cri.LinuxContainerResources:
    return cri.LinuxContainerResources(cpu_shares=milli_to_shares(milli),
                                       cpu_quota=milli * 100 if guaranteed else 0, cpu_period=100000,
                                       memory_limit_in_bytes=64 << 20 if guaranteed else 0)


@pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")
def test_static_policy_pins_and_restores(containerd, workdir, direct):
    config = workdir / "static.yaml"
    config.write_text("policy:\n  Active: static\n")
    relay = RelayProcess(workdir, containerd.socket, "--force-config", str(config)).start()
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

        # kill -9 and restart: every cgroup stays as it was.
        assert relay.stop(signal.SIGKILL) == -signal.SIGKILL
        via.close()
        relay = RelayProcess(workdir, containerd.socket, "--force-config", str(config),
                             relay_dir=relay.relay_dir).start()
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


def test_request_that_cannot_fit_fails_create(containerd, workdir):
    config = workdir / "static.yaml"
    config.write_text("policy:\n  Active: static\n")
    relay = RelayProcess(workdir, containerd.socket, "--force-config", str(config)).start()
    via = Cri(relay.socket)
    try:
        import grpc

        cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pod = via.run_pod(cfg)
        with pytest.raises(grpc.RpcError) as info:
            via.create(pod, cfg, container_config(resources=resources(64000, True)))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"default/{cfg.metadata.name}/main needs 64 exclusive CPUs" in info.value.details()
        via.remove_pod(pod)
    finally:
        via.close()
        relay.stop()


@pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")
def test_containers_started_while_down_are_allocated(containerd, workdir, direct):
    config = workdir / "static.yaml"
    config.write_text("policy:\n  Active: static\n")
    relay = RelayProcess(workdir, containerd.socket, "--force-config", str(config)).start()
    relay.stop()
    # Behind the relay's back: a Guaranteed 1-CPU container and a shared one, both unpinned.
    g_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
    s_cfg = pod_config(qos="besteffort", logdir=str(workdir / "logs"))
    pods = [direct.run_pod(g_cfg), direct.run_pod(s_cfg)]
    try:
        g = direct.run_container(pods[0], g_cfg, container_config(resources=resources(1000, True)))
        s = direct.run_container(pods[1], s_cfg, container_config(resources=resources(0, False)))
        assert cgroup_cpus(g_cfg, g) == ONLINE
        relay = RelayProcess(workdir, containerd.socket, "--force-config", str(config),
                             relay_dir=relay.relay_dir).start()
        try:
            mine = cgroup_cpus(g_cfg, g)
            assert len(mine) == 1
            assert cgroup_cpus(s_cfg, s) == ONLINE - mine
        finally:
            relay.stop()
    finally:
        for p in pods:
            direct.remove_pod(p)
