"""cri-resmgr as an NRI plugin of the real containerd: kubelet's calls go straight to containerd,
which asks the plugin at each event; the cgroups of real containers show the result."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from harness.containerd import REQUIRE_CRI_RESMGR, PrivateContainerd
from harness.relay import NriProcess, policy_relay
from resmgr.generated.cri import api_pb2 as cri
from resmgr.topology.cpuset import CPUSet
from tests.support.helpers import (
    ONLINE,
    ROOT,
    Cri,
    Link,
    Pods,
    cgroup_cpus,
    container_config,
    pod_config,
    resources,
    wait_until,
)
from tests.support.hookplugin import Plugin

pytestmark = [pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")]


def nri_plugin(workdir: Path, containerd, policy: str, *extra: str, relay_dir: Path | None = None) -> NriProcess:
    config = workdir / f"{policy}.yaml"
    config.write_text(f"policy:\n  Active: {policy}\n")
    return NriProcess(workdir, str(containerd.dir / "nri.sock"), "--force-config", str(config),
                      "--hook-dir", "disabled", *extra, relay_dir=relay_dir)


@pytest.fixture
def pods(containerd, workdir):
    """Pods made straight in containerd, as kubelet does in NRI mode."""
    client = Cri(containerd.socket)
    p = Pods(client, workdir)
    yield p
    p.remove_all()
    client.close()


def run(pods: Pods, qos: str, milli: int, **kw: object) -> tuple[cri.PodSandboxConfig, str]:
    cfg, _, cid = pods.run(qos, resources(milli, qos == "guaranteed"), **kw)
    return cfg, cid


def remove(pods: Pods, cid: str) -> None:
    pods.client.rt.StopContainer(cri.StopContainerRequest(container_id=cid, timeout=1), timeout=30)
    pods.client.rt.RemoveContainer(cri.RemoveContainerRequest(container_id=cid), timeout=30)


def grants(relay_dir: Path, *ids: str) -> dict[str, str]:
    """The CPUs the saved state grants, once it names every one of ids: the state is written
    moments after the runtime applied the answer that carried them."""
    def read() -> dict[str, str]:
        path = relay_dir / "cache"
        state = json.loads(path.read_text()) if path.exists() else {"containers": []}
        return {c["id"]: c["resources"].get("cpuset_cpus", "") for c in state["containers"]}
    wait_until(lambda: set(ids) <= read().keys(), what=f"state saved with {', '.join(ids)}")
    return read()


@pytest.mark.parametrize("policy", ["static", "topology-aware"])
def test_nri_pins_containers_and_gives_cpus_back(containerd, workdir, pods, policy):
    plugin = nri_plugin(workdir, containerd, policy).start()
    try:
        s_cfg, shared = run(pods, "burstable", 200)
        assert cgroup_cpus(s_cfg, shared) == ONLINE
        g_cfg, mine_id = run(pods, "guaranteed", 1000)
        mine = cgroup_cpus(g_cfg, mine_id)
        assert len(mine) == 1
        # The shared container left the exclusive CPU within the same CreateContainer answer.
        assert cgroup_cpus(s_cfg, shared) == ONLINE - mine
        if policy == "topology-aware":
            assert cgroup_cpus(g_cfg, mine_id) == mine
        remove(pods, mine_id)
        wait_until(lambda: cgroup_cpus(s_cfg, shared) == ONLINE, what="shared container back on every CPU")
        assert "Traceback" not in plugin.log()
    finally:
        plugin.stop()


def test_synchronize_adopts_what_runs_and_restarts_lose_nothing(containerd, workdir, pods):
    # Made before the plugin connects: containerd runs them unpinned.
    s_cfg, shared = run(pods, "burstable", 200)
    g_cfg, mine_id = run(pods, "guaranteed", 1000)
    assert cgroup_cpus(g_cfg, mine_id) == ONLINE == cgroup_cpus(s_cfg, shared)
    plugin = nri_plugin(workdir, containerd, "static").start()
    try:
        # Synchronize's answer put every container where the policy wants it (the runtime applies
        # it once the answer is in).
        wait_until(lambda: len(cgroup_cpus(g_cfg, mine_id)) == 1, what="adopted exclusive container pinned")
        mine = cgroup_cpus(g_cfg, mine_id)
        wait_until(lambda: cgroup_cpus(s_cfg, shared) == ONLINE - mine, what="adopted shared container moved")
        before = grants(plugin.relay_dir, mine_id, shared)

        # containerd killed and started again under the plugin: it reconnects and synchronizes again.
        containerd.restart()
        plugin.wait_synchronized(timeout=60)
        assert grants(plugin.relay_dir) == before
        assert cgroup_cpus(g_cfg, mine_id) == mine and cgroup_cpus(s_cfg, shared) == ONLINE - mine

        # The plugin killed with SIGKILL and started again: the same grants, nothing booked twice.
        assert plugin.stop(signal.SIGKILL) == -signal.SIGKILL
        plugin = nri_plugin(workdir, containerd, "static", relay_dir=plugin.relay_dir).start()
        assert grants(plugin.relay_dir) == before
        assert cgroup_cpus(g_cfg, mine_id) == mine
        # No CPU is left for a second exclusive container: refused, never given the same CPU.
        with pytest.raises(grpc.RpcError) as err:
            run(pods, "guaranteed", 1000)
        assert "needs 1 exclusive CPUs; only 0 can be given" in err.value.details()
        remove(pods, mine_id)
        wait_until(lambda: cgroup_cpus(s_cfg, shared) == ONLINE, what="shared container back on every CPU")
        assert "Traceback" not in plugin.log()
    finally:
        plugin.stop()


def test_a_container_the_kernel_still_runs_on_the_cpus_of_one_starting_is_moved_off_them_first(
        containerd, workdir, pods):
    """containerd logs and ignores a failed update a CreateContainer answer carries (a shim that does
    not answer in time, on a busy node): the new container would start on CPUs the shared one still
    runs on. At the start event the plugin reads the kernel, not the runtime's word."""
    plugin = nri_plugin(workdir, containerd, "static", "--reconcile-interval", "1h").start()
    try:
        s_cfg, shared = run(pods, "burstable", 200)
        g_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pod = pods.client.run_pod(g_cfg)
        pods.ids.append(pod)
        mine_id = pods.client.create(pod, g_cfg, container_config(resources=resources(1000, True)))
        mine = CPUSet.parse(grants(plugin.relay_dir, mine_id)[mine_id])
        assert cgroup_cpus(s_cfg, shared) == ONLINE - mine  # the answer's update, applied
        write_cpus(s_cfg, shared, ONLINE)  # as if it had failed
        pods.client.start(mine_id)
        assert cgroup_cpus(s_cfg, shared) == ONLINE - mine
        assert f"it still runs on CPUs of container {mine_id}, which is starting" in plugin.log()
    finally:
        plugin.stop()


def write_cpus(pod: cri.PodSandboxConfig, cid: str, cpus: CPUSet) -> None:
    for base in (Path("/sys/fs/cgroup/cpuset"), Path("/sys/fs/cgroup")):
        path = base / pod.linux.cgroup_parent.lstrip("/") / cid / "cpuset.cpus"
        if path.exists():
            path.write_text(str(cpus))
            return
    raise AssertionError(f"no cpuset cgroup for container {cid}")


def test_a_resize_while_the_plugin_is_down_is_placed_once_it_is_back(containerd, workdir, pods):
    """kubelet resizes a container straight in containerd while the plugin is down: containerd keeps
    the new limits, and its next synchronization has the plugin place the container for them."""
    plugin = nri_plugin(workdir, containerd, "static").start()
    try:
        g_cfg, mine_id = run(pods, "guaranteed", 1000)
        assert len(cgroup_cpus(g_cfg, mine_id)) == 1
        grants(plugin.relay_dir, mine_id)  # saved (a write-behind) before the kill, or it comes back as new
        plugin.stop(signal.SIGKILL)
        pods.client.rt.UpdateContainerResources(cri.UpdateContainerResourcesRequest(
            container_id=mine_id, linux=resources(500, True)), timeout=30)  # no longer whole CPUs
        assert len(cgroup_cpus(g_cfg, mine_id)) == 1  # containerd alone keeps the cpuset
        plugin = nri_plugin(workdir, containerd, "static", relay_dir=plugin.relay_dir).start()
        wait_until(lambda: cgroup_cpus(g_cfg, mine_id) == ONLINE, what="the resized container on the shared CPUs")
        assert "resized while we were away" in plugin.log()
    finally:
        plugin.stop()


def test_a_node_moves_from_relay_to_nri_and_back_keeping_its_allocations(containerd, workdir):
    relay = policy_relay(workdir, containerd.socket, "static").start()
    via = Cri(relay.socket)
    pod_ids = []
    plugin = None
    try:
        g_cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pod_ids.append(via.run_pod(g_cfg))
        mine_id = via.run_container(pod_ids[-1], g_cfg, container_config(resources=resources(1000, True)))
        mine = cgroup_cpus(g_cfg, mine_id)
        before = grants(relay.relay_dir)
        relay.stop()
        via.close()

        plugin = nri_plugin(workdir, containerd, "static", relay_dir=relay.relay_dir).start()
        assert grants(plugin.relay_dir) == before and cgroup_cpus(g_cfg, mine_id) == mine
        assert "runs with other CPUs" not in plugin.log()  # found as the relay left it: nothing to repair
        # While the plugin runs, the state cannot be reset under it.
        out = subprocess.run([sys.executable, "-m", "resmgr", "--relay-dir", str(plugin.relay_dir),
                              "--relay-socket", str(workdir / "none.sock"), "--reset-policy"],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert out.returncode == 1 and "another cri-resmgr uses the state" in out.stderr
        plugin.stop()

        relay = policy_relay(workdir, containerd.socket, "static", relay_dir=relay.relay_dir).start()
        via = Cri(relay.socket)
        assert grants(relay.relay_dir) == before and cgroup_cpus(g_cfg, mine_id) == mine
        # Two front ends on one state at once would double-book: the second refuses to start.
        second = nri_plugin(workdir, containerd, "static", relay_dir=relay.relay_dir).start(wait=False)
        assert second.proc.wait(20) == 1 and "another cri-resmgr uses the state" in second.log()
    finally:
        for p in pod_ids:
            via.remove_pod(p)
        via.close()
        relay.stop()
        if plugin is not None and plugin.proc.poll() is None:
            plugin.stop()


def test_a_policy_switch_pushed_by_the_agent_repins_the_containers_it_moves(containerd, workdir, pods):
    """With UpdateContainers, or where the runtime's UpdateContainers can deadlock it (containerd
    before 2.4.0), by synchronizing again."""
    plugin = NriProcess(workdir, str(containerd.dir / "nri.sock"), "--hook-dir", "disabled").start()
    link = Link(str(workdir / "config.sock"))
    try:
        g_cfg, mine_id = run(pods, "guaranteed", 1000)
        s_cfg, shared = run(pods, "besteffort", 0)
        assert cgroup_cpus(g_cfg, mine_id) == ONLINE == cgroup_cpus(s_cfg, shared)
        assert link.push({"policy": "Active: static\n"}) == ""
        wait_until(lambda: len(cgroup_cpus(g_cfg, mine_id)) == 1, what="exclusive CPU after the switch")
        mine = cgroup_cpus(g_cfg, mine_id)
        wait_until(lambda: cgroup_cpus(s_cfg, shared) == ONLINE - mine, what="shared container moved")
        assert "UpdateContainers for" not in plugin.log() and "refused the update" not in plugin.log()
        if "can deadlock on UpdateContainers" in plugin.log():
            assert "synchronizing with the runtime again" in plugin.log()
        assert link.push({"policy": "Active: none\n"}) == ""
        assert link.status().policy == "none"
    finally:
        link.close()
        plugin.stop()


def test_the_probe_passes_only_while_the_plugin_is_registered_with_the_runtime(containerd, workdir):
    """`cri-resmgr status --probe`, and the readiness file the chart's probes read."""
    ready = workdir / "ready"

    def status(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "resmgr", "status", *args, "--config-socket",
                               str(workdir / "config.sock")], cwd=ROOT, capture_output=True, text=True, timeout=30)

    def probe() -> subprocess.CompletedProcess[str]:
        return status("--probe")

    nowhere = NriProcess(workdir, str(workdir / "no-nri.sock"), "--hook-dir", "disabled",
                         "--ready-file", str(ready)).start(wait=False)
    try:
        wait_until(lambda: (workdir / "config.sock").exists(), what="the config socket")
        out = probe()
        assert out.returncode == 1 and "not registered with the runtime" in out.stderr, out
        full = status()
        assert full.returncode == 5 and "not serving: not registered" in full.stdout, full
        assert not ready.exists()
    finally:
        nowhere.stop()
    plugin = NriProcess(workdir, str(containerd.dir / "nri.sock"), "--hook-dir", "disabled",
                        "--ready-file", str(ready)).start()
    try:
        out = probe()
        assert out.returncode == 0 and out.stdout == out.stderr == "", out
        wait_until(ready.exists, what="the readiness file")
        assert "cri-resmgr ready" in plugin.log()
    finally:
        plugin.stop()
    out = probe()
    assert out.returncode == 1 and "cannot reach" in out.stderr
    assert not ready.exists()  # gone with the daemon


def test_hook_plugins_run_from_nri_events(containerd, workdir, pods, tmp_path):
    hookdir = workdir / "hookserver.d"
    hookdir.mkdir()
    hook = Plugin(workdir, "h1").start()
    hook.register(hookdir, ["PreRunPodSandbox", "PreCreateContainer", "PostStartContainer", "PostStopContainer"])
    config = workdir / "static.yaml"
    config.write_text("policy:\n  Active: static\n")
    plugin = NriProcess(workdir, str(containerd.dir / "nri.sock"), "--force-config", str(config),
                        "--hook-dir", str(hookdir)).start()
    try:
        cfg, cid = run(pods, "burstable", 200, command=["sh", "-c", "sleep 3600"])
        env = pods.client.rt.ExecSync(cri.ExecSyncRequest(container_id=cid, cmd=["env"], timeout=10), timeout=20)
        assert "HOOKED_BY=h1" in env.stdout.decode()
        status = pods.client.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=cid, verbose=True), timeout=10)
        spec = json.loads(status.info["info"])["runtimeSpec"]  # NRI adjusts the OCI spec, not CRI's record
        assert spec["annotations"].get("example.com/hooked-by") == "h1"
        wait_until(lambda: hook.calls("PostStartContainer"), what="PostStartContainer")
        start = hook.calls("PostStartContainer")[0]["request"]
        assert start["container_meta"]["id"] == cid and start["pod_meta"]["name"] == cfg.metadata.name
        assert start["container_envs"]["HOOKED_BY"] == "h1"
        remove(pods, cid)
        wait_until(lambda: hook.calls("PostStopContainer"), what="PostStopContainer")
        assert {c["hook"] for c in hook.calls()} >= {"PreRunPodSandbox", "PreCreateContainer"}

        # A failing plugin under the Fail policy fails the create in containerd; nothing is kept.
        hook.stop()
        bad = Plugin(workdir, "h0").start("--mode", "error")
        bad.register(hookdir, ["PreCreateContainer"], policy="Fail")
        time.sleep(0.5)
        with pytest.raises(grpc.RpcError) as err:
            run(pods, "burstable", 200)
        assert "h0" in err.value.details()
        bad.stop()
        assert not [c for c in grants(plugin.relay_dir) if c.startswith("pending")]
    finally:
        plugin.stop()
        hook.stop()


def test_containerd_launches_the_plugin_from_its_plugin_directory(containerd, workdir, pods):
    """Placed in containerd's plugin directory, the plugin is started by containerd with an inherited socket,
    and exits when that connection ends (containerd starts a new copy when it comes back)."""
    config = workdir / "static.yaml"
    config.write_text("policy:\n  Active: static\n")
    log = workdir / "launched.log"
    script = containerd.dir / "nri-plugins" / "45-resmgr-test"
    script.parent.mkdir(exist_ok=True)
    # containerd gives a launched plugin nothing but NRI_PLUGIN_{NAME,IDX,SOCKET}: absolute paths only.
    script.write_text(f"#!/bin/sh\ncd {ROOT}\nexec {sys.executable} -m resmgr --nri --relay-dir {workdir / 'state'} "
                      f"--force-config {config} --config-socket disabled --hook-dir disabled --log-level DEBUG "
                      f"--pid-file {workdir / 'launched.pid'} >>{log} 2>&1\n")
    script.chmod(0o755)
    try:
        containerd.restart()
        wait_until(lambda: log.exists() and "NRI: synchronized" in log.read_text(), timeout=30,
                   what="launched plugin synchronized")
        text = log.read_text()
        assert "registered as 45-resmgr-test" in text and "an inherited socket" in text
        g_cfg, mine_id = run(pods, "guaranteed", 1000)
        assert len(cgroup_cpus(g_cfg, mine_id)) == 1
        pid = int((workdir / "launched.pid").read_text())
        script.unlink()
        containerd.kill()
        wait_until(lambda: not Path(f"/proc/{pid}").exists() or
                   Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", timeout=15, what="launched plugin exit")
        assert "dropped its connection; exiting" in log.read_text()
    finally:
        script.unlink(missing_ok=True)
        if containerd.proc is None or containerd.proc.poll() is not None:
            containerd.start()


def test_a_runtime_requiring_the_plugin_makes_no_container_while_it_is_away(workdir):
    strict = PrivateContainerd(workdir / "strict", subnet="10.88.91.0/24", bridge="crirm91",
                               extra_config=REQUIRE_CRI_RESMGR).start()
    client = Cri(strict.socket)
    pods = Pods(client, workdir)
    try:
        cfg = pod_config(qos="guaranteed", logdir=str(workdir / "logs"))
        pod = client.run_pod(cfg)
        pods.ids.append(pod)
        config = container_config(resources=resources(1000, True))
        with pytest.raises(grpc.RpcError) as refused:
            client.create(pod, cfg, config)
        assert 'required plugin "cri-resmgr" not present' in refused.value.details()
        # What must start before the plugin (its own pod) says it tolerates its absence.
        tolerant = pod_config(qos="besteffort", logdir=str(workdir / "logs"), annotations={
            "tolerate-missing-plugins.cri-resource-manager.intel.com/pod": "true"})
        t_pod = client.run_pod(tolerant)
        pods.ids.append(t_pod)
        client.run_container(t_pod, tolerant, container_config())

        plugin = nri_plugin(workdir, strict, "static").start()
        try:
            mine = client.run_container(pod, cfg, config)  # kubelet's retry
            assert len(cgroup_cpus(cfg, mine)) == 1
        finally:
            plugin.stop()
    finally:
        pods.remove_all()
        client.close()
        strict.stop()
