"""Runtime hook plugins through the relay: real plugin processes, real sockets, the real containerd."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from resmgr.generated.cri import api_pb2 as cri
from tests.support.helpers import (
    ONLINE,
    Cri,
    RelayProcess,
    cgroup_cpus,
    container_config,
    pod_config,
    policy_relay,
    wait_until,
)
from tests.support.hookplugin import Plugin

ALL_HOOKS = ["PreRunPodSandbox", "PostStopPodSandbox", "PreCreateContainer", "PreStartContainer",
             "PostStartContainer", "PostStopContainer", "PreUpdateContainerResources"]
LIMITED = cri.LinuxContainerResources(cpu_shares=1024, cpu_quota=100000, cpu_period=100000,
                                      memory_limit_in_bytes=64 << 20)


@pytest.fixture
def hookdir(workdir):
    d = workdir / "hookserver.d"
    d.mkdir()
    return d


@pytest.fixture
def plugins(workdir):
    started: list[Plugin] = []

    def make(name: str, *args: str) -> Plugin:
        p = Plugin(workdir, name, *args).start()
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop(signal.SIGKILL)


@pytest.fixture
def hooked(containerd, workdir, hookdir):
    """A relay (none policy) with the hook directory, and a client through it; pods removed at the end."""
    relay = RelayProcess(workdir, containerd.socket, "--hook-dir", str(hookdir)).start()
    via = Cri(relay.socket)
    pods: list[str] = []
    yield relay, via, pods
    for pod in pods:
        try:
            via.remove_pod(pod)
        except grpc.RpcError:
            pass
    via.close()
    relay.stop()


def _registered(relay: RelayProcess, name: str, what: str = "registered") -> None:
    wait_until(lambda: f"hook plugin {name} {what}:" in relay.log(), timeout=5, what=f"{name} {what}")


def _cgroup_file(pod: cri.PodSandboxConfig, cid: str, v1: str, v2: str) -> str:
    parent = pod.linux.cgroup_parent.lstrip("/")
    for path in (Path("/sys/fs/cgroup/cpu") / parent / cid / v1, Path("/sys/fs/cgroup") / parent / cid / v2):
        if path.exists():
            return path.read_text().strip()
    raise AssertionError(f"no {v1} or {v2} for container {cid}")


def cgroup_quota(pod: cri.PodSandboxConfig, cid: str) -> int:
    text = _cgroup_file(pod, cid, "cpu.cfs_quota_us", "cpu.max")
    return int(text.split()[0]) if text.split()[0] != "max" else -1


def container_env(direct: Cri, cid: str) -> dict[str, str]:
    resp = direct.rt.ExecSync(cri.ExecSyncRequest(container_id=cid, cmd=["env"], timeout=10), timeout=20)
    return dict(line.split("=", 1) for line in resp.stdout.decode().splitlines() if "=" in line)


def _pod(workdir: Path, labels: dict[str, str] | None = None, qos: str = "burstable") -> cri.PodSandboxConfig:
    cfg = pod_config(qos=qos, logdir=str(workdir / "logs"))
    cfg.labels.update(labels or {})
    return cfg


def test_plugins_change_what_runs_and_get_full_context(hooked, hookdir, plugins, direct, workdir):
    relay, via, pods = hooked
    example = plugins("10-example")
    recorder = plugins("20-recorder", "--mode", "echo")
    example.register(hookdir, ["PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources"])
    recorder.register(hookdir, ALL_HOOKS)
    _registered(relay, "20-recorder")

    cfg = _pod(workdir, {"example.com/cpu-cap": "250m"})
    pods.append(via.run_pod(cfg))
    status = direct.rt.PodSandboxStatus(cri.PodSandboxStatusRequest(pod_sandbox_id=pods[-1]), timeout=10).status
    assert status.labels["hooked-by"] == "10-example"
    config = container_config(resources=LIMITED)
    config.envs.add(key="MINE", value=b"kept")
    cid = via.run_container(pods[-1], cfg, config)

    # The running container got both plugins' changes: environment, annotation, capped quota.
    env = container_env(direct, cid)
    assert env["HOOKED_BY"] == "10-example" and env["MINE"] == "kept"
    st = direct.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=cid), timeout=10).status
    assert st.annotations["example.com/hooked-by"] == "10-example"
    assert cgroup_quota(cfg, cid) == 25000

    # The recorder, called second, saw the first plugin's changes; StartContainer carries only an
    # ID, yet its hooks got the whole context from the engine's state.
    create = recorder.calls("PreCreateContainer")[-1]["request"]
    assert create["container_envs"]["HOOKED_BY"] == "10-example"
    assert create["container_resources"]["cpu_quota"] == "25000"
    for hook in ("PreStartContainer", "PostStartContainer"):
        req = recorder.calls(hook)[-1]["request"]
        assert req["container_meta"]["id"] == cid and req["container_meta"]["name"] == "main"
        assert req["pod_labels"]["example.com/cpu-cap"] == "250m" and req["pod_meta"]["uid"] == cfg.metadata.uid
        assert req["container_envs"]["MINE"] == "kept" and req["container_envs"]["HOOKED_BY"] == "10-example"
        assert req["container_resources"]["cpu_quota"] == "25000"
        assert req["pod_cgroup_parent"] == cfg.linux.cgroup_parent

    # kubelet raises the limit: the plugin caps it again.
    via.rt.UpdateContainerResources(cri.UpdateContainerResourcesRequest(
        container_id=cid, linux=cri.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000,
                                                            memory_limit_in_bytes=64 << 20)), timeout=30)
    assert cgroup_quota(cfg, cid) == 25000
    assert recorder.calls("PreUpdateContainerResources")[-1]["request"]["container_resources"]["cpu_quota"] == "25000"

    via.rt.StopContainer(cri.StopContainerRequest(container_id=cid, timeout=1), timeout=30)
    assert recorder.calls("PostStopContainer")[-1]["request"]["container_meta"]["id"] == cid
    via.rt.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pods[-1]), timeout=30)
    assert recorder.calls("PostStopPodSandbox")[-1]["request"]["pod_meta"]["uid"] == cfg.metadata.uid


def test_skip_label_bypasses_every_plugin(hooked, hookdir, plugins, workdir):
    relay, via, pods = hooked
    recorder = plugins("recorder", "--mode", "error")
    recorder.register(hookdir, ALL_HOOKS, policy="Fail")
    _registered(relay, "recorder")
    cfg = _pod(workdir, {"runtimeproxy.koordinator.sh/skip-hookserver": "true"})
    pods.append(via.run_pod(cfg))
    via.run_container(pods[-1], cfg, container_config())
    via.remove_pod(pods.pop())
    assert recorder.calls() == []


@pytest.mark.parametrize("mode", ["error", "hang", "crash"])
def test_failure_policies(hooked, hookdir, plugins, direct, workdir, mode):
    relay, via, pods = hooked
    bad = plugins("bad", "--mode", mode)
    bad.register(hookdir, ["PreCreateContainer"], policy="Fail", timeout="500ms")
    _registered(relay, "bad")
    cfg = _pod(workdir)
    pods.append(via.run_pod(cfg))
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        via.create(pods[-1], cfg, container_config())
    assert time.monotonic() - started < 5
    code = {"error": grpc.StatusCode.INVALID_ARGUMENT, "hang": grpc.StatusCode.DEADLINE_EXCEEDED,
            "crash": grpc.StatusCode.UNAVAILABLE}[mode]
    assert info.value.code() == code, info.value.details()
    assert "runtime hook plugin bad failed in PreCreateContainer" in info.value.details()
    # The runtime was never asked, and nothing stays granted.
    assert not direct.rt.ListContainers(cri.ListContainersRequest(
        filter=cri.ContainerFilter(pod_sandbox_id=pods[-1])), timeout=10).containers

    # Ignore: logged, that plugin's changes dropped, the call goes on.
    if mode == "crash":
        bad.start()  # it crashed; the next call reconnects to the new process
    bad.register(hookdir, ["PreCreateContainer"], policy="Ignore", timeout="500ms")
    _registered(relay, "bad", "changed")
    cid = via.run_container(pods[-1], cfg, container_config())
    assert "HOOKED_BY" not in container_env(direct, cid)
    assert "going on without it" in relay.log()


def test_plugin_down_then_back(hooked, hookdir, plugins, direct, workdir):
    relay, via, pods = hooked
    plugin = plugins("flaky")
    plugin.register(hookdir, ["PreCreateContainer"], policy="Fail")
    _registered(relay, "flaky")
    plugin.stop(signal.SIGKILL)
    cfg = _pod(workdir)
    pods.append(via.run_pod(cfg))
    with pytest.raises(grpc.RpcError) as info:
        via.create(pods[-1], cfg, container_config())
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "flaky" in info.value.details()
    plugin.start()
    cid = via.run_container(pods[-1], cfg, container_config())
    assert container_env(direct, cid)["HOOKED_BY"] == "flaky"


def test_parallel_pods_with_a_slow_and_a_hung_plugin(hooked, hookdir, plugins, workdir):
    relay, via, pods = hooked
    slow = plugins("slow", "--mode", "slow", "--delay", "1")
    stuck = plugins("stuck", "--mode", "hang", "--only-label", "stuck=yes")
    slow.register(hookdir, ["PreRunPodSandbox", "PreCreateContainer"], policy="Fail")
    stuck.register(hookdir, ["PreRunPodSandbox"], timeout="30s")
    _registered(relay, "stuck")
    lock = threading.Lock()

    def one(labels: dict[str, str]) -> float:
        started = time.monotonic()
        cfg = _pod(workdir, labels)
        pod = via.run_pod(cfg)
        with lock:
            pods.append(pod)
        via.create(pod, cfg, container_config())
        return time.monotonic() - started

    with ThreadPoolExecutor(21) as pool:
        hung = pool.submit(one, {"stuck": "yes"})
        time.sleep(0.2)
        started = time.monotonic()
        took = list(pool.map(one, [{"n": str(i)} for i in range(20)]))
        elapsed = time.monotonic() - started
        # 20 pods, two 1 s hook calls each: in parallel, not one after another (40 s), and never
        # behind the pod whose plugin hangs.
        assert elapsed < 15, took
        assert not hung.done()
        assert hung.result(60) > 25  # the hung plugin timed out (Ignore) and its pod went on
    assert len(slow.calls("PreCreateContainer")) == 21


def test_registrations_replaced_and_removed_under_load(hooked, hookdir, plugins, workdir, direct):
    relay, via, pods = hooked
    a = plugins("a", "--mode", "slow", "--delay", "0.3")
    b = plugins("b", "--mode", "slow", "--delay", "0.3")
    a.register(hookdir, ["PreCreateContainer"], policy="Fail", file="plugin.json")
    _registered(relay, "plugin")
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            (a if i % 2 else b).register(hookdir, ["PreCreateContainer"], policy="Fail", file="plugin.json")
            time.sleep(0.05)
            if i % 5 == 0:
                (hookdir / "plugin.json").unlink()
                time.sleep(0.05)

    def one(i: int) -> str:
        cfg = _pod(workdir)
        pod = via.run_pod(cfg)
        pods.append(pod)
        return via.create(pod, cfg, container_config())

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        with ThreadPoolExecutor(10) as pool:
            created = list(pool.map(one, range(20)))  # Fail policy: any lost call would fail a create
            # Which plugin a create meets is up to timing: go on until both have been met (bounded).
            while not (a.calls("PreCreateContainer") and b.calls("PreCreateContainer")) and len(created) < 60:
                created += pool.map(one, range(10))
    finally:
        stop.set()
        churner.join()
    assert len(set(created)) == len(created) >= 20
    assert a.calls("PreCreateContainer") and b.calls("PreCreateContainer")


def test_post_hook_has_full_context_after_kill_9(containerd, workdir, hookdir, plugins, direct):
    recorder = plugins("recorder")
    recorder.register(hookdir, ["PreCreateContainer", "PostStartContainer"])
    relay = RelayProcess(workdir, containerd.socket, "--hook-dir", str(hookdir)).start()
    via = Cri(relay.socket)
    cfg = _pod(workdir, {"team": "blue"})
    pod = via.run_pod(cfg)
    try:
        config = container_config(resources=LIMITED)
        config.envs.add(key="MINE", value=b"kept")
        cid = via.create(pod, cfg, config)
        assert relay.stop(signal.SIGKILL) == -signal.SIGKILL
        via.close()
        relay = RelayProcess(workdir, containerd.socket, "--hook-dir", str(hookdir)).start()
        via = Cri(relay.socket)
        via.start(cid)
        req = recorder.calls("PostStartContainer")[-1]["request"]
        assert req["container_meta"]["id"] == cid and req["pod_labels"]["team"] == "blue"
        assert req["container_envs"] == {"MINE": "kept", "HOOKED_BY": "recorder"}
        assert req["container_resources"]["cpu_quota"] == "100000"
        assert req["container_annotations"]["example.com/hooked-by"] == "recorder"
        assert req["pod_cgroup_parent"] == cfg.linux.cgroup_parent
    finally:
        via.remove_pod(pod)
        via.close()
        relay.stop()


@pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")
def test_the_policy_pinning_stands(containerd, workdir, hookdir, plugins, direct):
    greedy = plugins("greedy", "--cpuset", str(ONLINE))  # every CPU: never the one exclusive CPU
    greedy.register(hookdir, ["PreCreateContainer"])
    relay = policy_relay(workdir, containerd.socket, "static", "--hook-dir", str(hookdir)).start()
    via = Cri(relay.socket)
    cfg = _pod(workdir, qos="guaranteed")
    pod = via.run_pod(cfg)
    try:
        cid = via.run_container(pod, cfg, container_config(resources=LIMITED))
        mine = cgroup_cpus(cfg, cid)
        assert len(mine) == 1 and container_env(direct, cid)["HOOKED_BY"] == "greedy"
        assert "the policy's pinning stands" in relay.log()
    finally:
        via.remove_pod(pod)
        via.close()
        relay.stop()
