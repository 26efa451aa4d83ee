"""Persisted state and reconciliation with the real containerd across relay restarts."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import grpc
import pytest

from harness.relay import free_port
from resmgr.generated.cri import api_pb2 as cri
from resmgr.view import client
from tests.support.helpers import (
    ONLINE,
    Cri,
    RelayProcess,
    cgroup_cpus,
    container_cgroup,
    container_config,
    fill,
    pod_config,
    policy_relay,
    resmgr_status,
    wait_until,
)


def guaranteed_cpu() -> cri.LinuxContainerResources:
    return cri.LinuxContainerResources(cpu_shares=1024, cpu_quota=100000, cpu_period=100000,
                                       memory_limit_in_bytes=64 << 20)


def state_of(relay: RelayProcess) -> dict:
    return json.loads((relay.relay_dir / "cache").read_text())


def test_kill9_loses_nothing_and_restart_reconciles(containerd, workdir, direct):
    relay = RelayProcess(workdir, containerd.socket).start()
    via = Cri(relay.socket)
    cfgs = [pod_config(qos=q, logdir=str(workdir / "logs")) for q in ("guaranteed", "burstable", "besteffort")]
    pods = [via.run_pod(c) for c in cfgs]
    c1 = via.run_container(pods[0], cfgs[0], container_config("app"))
    state = state_of(relay)
    assert {p["id"]: p["qos_class"] for p in state["pods"]} == dict(
        zip(pods, ["Guaranteed", "Burstable", "BestEffort"], strict=True))
    assert [(c["id"], c["state"]) for c in state["containers"]] == [(c1, "running")]
    assert relay.stop(signal.SIGKILL) == -signal.SIGKILL
    via.close()

    # While the relay is down: one pod goes away, another appears behind our back.
    direct.remove_pod(pods[1])
    extra_cfg = pod_config(qos="burstable", logdir=str(workdir / "logs"))
    extra = direct.run_pod(extra_cfg)
    c_extra = direct.run_container(extra, extra_cfg, container_config(
        "side", resources=cri.LinuxContainerResources(cpu_shares=256, cpuset_cpus="0")))

    relay2 = RelayProcess(workdir, containerd.socket, relay_dir=relay.relay_dir).start()
    try:
        state = state_of(relay2)
        by_id = {p["id"]: p for p in state["pods"]}
        assert set(by_id) == {pods[0], pods[2], extra}
        assert by_id[extra]["qos_class"] == "Burstable"
        assert by_id[extra]["cgroup_parent"] == extra_cfg.linux.cgroup_parent
        assert by_id[extra]["namespace"] == "default" and by_id[extra]["uid"] == extra_cfg.metadata.uid
        ctrs = {c["id"]: c for c in state["containers"]}
        assert set(ctrs) == {c1, c_extra}
        assert ctrs[c_extra]["name"] == "side" and ctrs[c_extra]["state"] == "running"
        assert ctrs[c_extra]["requested"]["cpu_shares"] == 256
        assert ctrs[c_extra]["requested"]["cpuset_cpus"] == "0"
        assert "adopted 1 pods, 1 containers; dropped 1 pods" in relay2.log()
    finally:
        relay2.stop()
        for p in (pods[0], pods[2], extra):
            direct.remove_pod(p)


@pytest.mark.parametrize("content", ["{ this is not json", '{"version":1,"policy":"static"}',
                                     '{"version":1,"pods":' + "[" * 50000 + "]" * 50000 + "}"])
def test_broken_state_file_is_moved_aside_and_rebuilt(containerd, workdir, direct, content):
    cfg = pod_config(logdir=str(workdir / "logs"))
    pod = direct.run_pod(cfg)
    state_dir = workdir / "state"
    state_dir.mkdir()
    (state_dir / "cache").write_text(content)
    (state_dir / "cache").chmod(0o600)
    relay = RelayProcess(workdir, containerd.socket).start()
    try:
        assert any(p.name.startswith("cache.broken-") for p in state_dir.iterdir())
        assert "unusable" in relay.log()
        assert pod in {p["id"] for p in state_of(relay)["pods"]}
    finally:
        relay.stop()
        direct.remove_pod(pod)


def test_stop_and_remove_update_state(containerd, relay, via, workdir):
    cfg = pod_config(logdir=str(workdir / "logs"))
    pod = via.run_pod(cfg)
    cid = via.run_container(pod, cfg, container_config())
    via.rt.StopContainer(cri.StopContainerRequest(container_id=cid, timeout=1), timeout=30)
    assert [c["state"] for c in state_of(relay)["containers"]] == ["exited"]
    via.rt.RemoveContainer(cri.RemoveContainerRequest(container_id=cid), timeout=30)
    assert state_of(relay)["containers"] == []
    via.rt.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod), timeout=30)
    assert [p["state"] for p in state_of(relay)["pods"]] == ["notready"]
    via.rt.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod), timeout=30)
    assert state_of(relay)["pods"] == []


@pytest.mark.skipif(len(ONLINE) != 2, reason="counts on 2 CPUs: one exclusive grant fills the machine")
def test_without_configuration_the_persisted_policy_is_kept(containerd, workdir, direct):
    relay = policy_relay(workdir, containerd.socket, "static").start()
    via = Cri(relay.socket)
    pods = []
    try:
        g_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(g_cfg))
        g = via.run_container(pods[-1], g_cfg, container_config(resources=guaranteed_cpu()))
        mine = cgroup_cpus(g_cfg, g)
        assert relay.stop(signal.SIGKILL) == -signal.SIGKILL
        via.close()
        # Started again with no configuration at all: still static, so the CPU is not handed out twice.
        relay = RelayProcess(workdir, containerd.socket, relay_dir=relay.relay_dir).start()
        via = Cri(relay.socket)
        assert "keeping the static policy" in relay.log()
        other_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(other_cfg))
        with pytest.raises(grpc.RpcError) as info:
            via.create(pods[-1], other_cfg, container_config(resources=guaranteed_cpu()))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert cgroup_cpus(g_cfg, g) == mine
    finally:
        for p in pods:
            via.remove_pod(p)
        via.close()
        relay.stop()


def test_snapshots_are_plain_copies_that_round_trip():
    """to_dict is hand-written for speed (a snapshot is taken at every lifecycle event): it must
    say what dataclasses.asdict says, and share no mutable value with the live object."""
    import dataclasses

    from resmgr.model import Container, Pod, Resources

    res = Resources(cpu_shares=2, cpuset_cpus="1", unified={"memory.high": "1"}, hugepage_limits={"2MB": 4})
    c = Container(id="c", pod_id="p", name="n", command=["sh"], labels={"a": "b"}, hints={"/dev/x": [0, 1]},
                  requested=res, resources=res, adjusted=Resources(cpu_quota=5), env={"K": "v"})
    p = Pod(id="p", uid="u", name="n", namespace="ns", labels={"l": "v"}, resources=res)
    for obj in (c, p):
        d = obj.to_dict()
        plain = dataclasses.asdict(obj)
        for key in ("requested", "resources", "adjusted", "overhead"):
            if key in plain and plain[key] is not None:
                plain[key] = {k: v for k, v in plain[key].items() if v}
        assert d == {k: getattr(v, "value", v) for k, v in plain.items()}
        assert type(obj).from_dict(d) == obj
    d = c.to_dict()
    d["labels"]["x"] = "y"
    d["hints"]["/dev/x"].append(9)
    d["resources"]["unified"]["x"] = "y"
    assert c.labels == {"a": "b"} and c.hints == {"/dev/x": [0, 1]} and "x" not in c.resources.unified


def mount_small(fs: str, where: Path, scratch: Path) -> None:
    """A small file system of its own at where."""
    if fs == "tmpfs":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(where)], check=True)
        return
    # ext4 on a loop device, as a node's own disk: it counts as free blocks it gives nobody.
    image = scratch / "state.img"
    subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(where)], check=True)
    where.chmod(0o700)


@pytest.mark.parametrize("fs", ["tmpfs", "ext4"])
def test_a_full_state_directory_refuses_no_pod_crashes_nothing_and_is_written_once_there_is_room(
        containerd, workdir, fs):
    """The state directory's file system full: containers are still made and placed, the condition is
    reported (log, metric, status), a crash meanwhile restarts into service and loses nothing, and the
    state is written as soon as there is room again."""
    state = workdir / "state"
    state.mkdir()
    mount_small(fs, state, workdir)
    address = f"127.0.0.1:{free_port()}"
    relays: list[RelayProcess] = []
    pods: list[str] = []
    direct = Cri(containerd.socket)

    def relay() -> tuple[RelayProcess, Cri]:
        r = RelayProcess(workdir, containerd.socket, "--metrics-address", address, relay_dir=state).start()
        relays.append(r)
        return r, Cri(r.socket)

    def failing() -> str:
        metrics = client.get(address, "/metrics").decode()
        return next((line.split()[1] for line in metrics.splitlines()
                     if line.startswith('cri_resmgr_state_write_failing{file="cache"}')), "absent")

    try:
        first, via = relay()
        cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pods.append(via.run_pod(cfg))
        before = via.run_container(pods[0], cfg, container_config("before", resources=guaranteed_cpu()))
        fill(state / "fill")  # every block taken
        # No write is due: the daemon finds the full disk by itself.
        wait_until(lambda: failing() == "1.0", timeout=30, what="the full disk reported with no call made")
        during = via.run_container(pods[0], cfg, container_config("during", resources=guaranteed_cpu()))
        running = {c.id for c in direct.rt.ListContainers(cri.ListContainersRequest(filter=cri.ContainerFilter(
            state=cri.ContainerStateValue(state=cri.CONTAINER_RUNNING)))).containers}
        assert running >= {before, during}
        wait_until(lambda: failing() == "1.0", what="the metric of failing state writes")
        problems = resmgr_status(str(workdir / "config.sock")).problems
        assert len(problems) == 1 and "No space left on device" in problems[0], problems
        assert "cannot write the state" in first.log()
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
        via.close()

        second, via = relay()  # starts on the full disk: no crash, and it adopts what it lost
        after = via.run_container(pods[0], cfg, container_config("after", resources=guaranteed_cpu()))
        wait_until(lambda: resmgr_status(str(workdir / "config.sock")).problems, what="the problem reported again")
        assert second.proc is not None and second.proc.poll() is None
        cpus = {c: cgroup_cpus(*container_cgroup(direct, c)) for c in (before, during, after)}
        if len(ONLINE) > 3:  # one CPU of their own each, none shared
            assert len(set(cpus.values())) == 3, cpus
        (state / "fill").unlink()
        wait_until(lambda: not resmgr_status(str(workdir / "config.sock")).problems, timeout=60,
                   what="the state written once there is room")
        assert {c["id"] for c in state_of(second)["containers"]} == {before, during, after}
        assert failing() == "0.0"
        assert "written to" in second.log() and "again" in second.log()
        # Full again, but for room a state fits in: each write takes the blocks the one before
        # freed, and nothing fails; the full disk is reported all the same.
        (state / "room").write_bytes(b"\0" * (2 * (state / "cache").stat().st_size))
        fill(state / "fill")
        (state / "room").unlink()
        wait_until(lambda: failing() == "1.0", timeout=30, what="the full disk reported with every write working")
        problems = resmgr_status(str(workdir / "config.sock")).problems
        assert len(problems) == 1 and "safely" in problems[0] and "full" in problems[0], problems
        (state / "fill").unlink()
        wait_until(lambda: failing() == "0.0", timeout=30, what="room again")
        via.close()
    finally:
        for r in relays:
            if r.proc is not None and r.proc.poll() is None:
                r.stop()
        for p in pods:
            direct.remove_pod(p)
        direct.close()
        subprocess.run(["umount", str(state)], check=False)
