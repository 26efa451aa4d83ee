"""Upgrades and rollbacks with pods running: the previous release (CHANGELOG.md names its commit;
harness/releases.py builds it from git) and this tree take turns on one state directory in front
of the real containerd. Every running container keeps its CPUs and is never restarted; what one
version decided, the other goes on from."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from harness import releases
from harness.relay import RelayProcess, policy_relay
from resmgr.generated.cri import api_pb2 as cri
from tests.support.helpers import ONLINE, Cri, Pods, cgroup_cpus, resources, wait_until

pytestmark = [pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")]


def relay(workdir, containerd, release: releases.Release | None = None) -> RelayProcess:
    r = policy_relay(workdir, containerd.socket, "topology-aware", relay_dir=workdir / "state")
    if release is not None:
        r.of_release(release.python, release.home)
    return r.start()


def reconciled(r: RelayProcess) -> None:
    wait_until(lambda: "reconciled with the runtime" in r.log(), timeout=30, what="the first reconciliation")


def started(direct: Cri, cid: str) -> tuple[int, int]:
    st = direct.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=cid), timeout=10).status
    return st.state, st.started_at


def test_a_relay_upgraded_from_the_previous_release_and_rolled_back_keeps_every_placement(
        containerd, workdir, direct, previous_release):
    previous = previous_release
    old = relay(workdir, containerd, previous)
    via = Cri(old.socket)
    pods = Pods(via, workdir)
    try:
        version = subprocess.run([str(previous.bin / "cri-resmgr"), "--version"], capture_output=True, text=True)
        assert version.stdout.strip() == f"cri-resmgr {previous.version}"
        g_cfg, g_pod, g = pods.run("guaranteed", resources(1000, True))
        b_cfg, _, b = pods.run("besteffort", resources(0, False))
        mine = cgroup_cpus(g_cfg, g)
        assert len(mine) == 1 and cgroup_cpus(b_cfg, b) == ONLINE - mine
        runs = {c: started(direct, c) for c in (g, b)}
        assert old.stop() == 0

        # Upgrade: the state the release wrote is read, nothing moves, nothing restarts.
        new = relay(workdir, containerd)
        reconciled(new)
        assert "unusable" not in new.log() and "re-allocating" not in new.log()
        assert (cgroup_cpus(g_cfg, g), cgroup_cpus(b_cfg, b)) == (mine, ONLINE - mine)
        # What the new version decides builds on the old one's: the exclusive CPU is given back.
        via.remove_pod(g_pod)
        wait_until(lambda: cgroup_cpus(b_cfg, b) == ONLINE, what="the shared container on every CPU")
        assert json.loads((workdir / "state" / "cache").read_text())["version"] == 1  # the release reads it
        assert new.stop() == 0

        # Rollback: the release reads what this tree wrote, and goes on from it.
        back = relay(workdir, containerd, previous)
        reconciled(back)
        assert "unusable" not in back.log()
        assert cgroup_cpus(b_cfg, b) == ONLINE
        g2_cfg, _, g2 = pods.run("guaranteed", resources(1000, True))
        again = cgroup_cpus(g2_cfg, g2)
        assert len(again) == 1
        wait_until(lambda: cgroup_cpus(b_cfg, b) == ONLINE - again, what="the shared container moved off it")
        assert started(direct, b) == runs[b]
        assert back.stop() == 0
    finally:
        pods.remove_all(direct)
        via.close()


def test_a_state_of_a_newer_release_stops_the_daemon_with_what_to_do(containerd, workdir):
    state = workdir / "state"
    state.mkdir(mode=0o700)
    (state / "cache").write_text(json.dumps({"version": 3, "pods": [], "containers": [], "newer": True}))
    (state / "cache").chmod(0o600)
    r = policy_relay(workdir, containerd.socket, "topology-aware", relay_dir=state).start(wait=False)
    assert r.proc is not None and r.proc.wait(30) != 0
    assert "written by a newer cri-resmgr (state version 3" in r.log() and "move the file aside" in r.log()
    assert json.loads((state / "cache").read_text())["newer"] is True  # left for the newer daemon
    assert r.stop(signal.SIGKILL) != 0
