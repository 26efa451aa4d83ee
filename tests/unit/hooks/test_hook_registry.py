"""Hook plugin registration files, the watched directory, and the hook chain over real gRPC sockets."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path

import grpc
import pytest

from examples.hook_plugin import ExamplePlugin, serve
from resmgr.generated.hooks import api_pb2 as pb
from resmgr.hooks import FailurePolicy, Hook, HookFailed, Hooks
from resmgr.hooks.registry import BadPlugin, parse
from resmgr.model import Container, Pod, Resources


def _spec(text: str):
    return parse(Path("/x/10-plugin.json"), text)


def test_parse_defaults_and_fields():
    spec = _spec('{"remote-endpoint": "unix:///run/p.sock", "runtime-hooks": ["PreCreateContainer"]}')
    assert (spec.name, spec.endpoint, spec.failure_policy, spec.timeout) == ("10-plugin", "/run/p.sock",
                                                                            FailurePolicy.IGNORE, 2.0)
    assert spec.hooks == {Hook.PRE_CREATE_CONTAINER}
    spec = _spec('{"remote-endpoint": "/p.sock", "failure-policy": "Fail", "runtime-hooks": [], "timeout": "250ms"}')
    assert (spec.failure_policy, spec.timeout, spec.hooks) == (FailurePolicy.FAIL, 0.25, frozenset())
    assert _spec('{"remote-endpoint": "/p.sock", "runtime-hooks": [], "timeout": 3}').timeout == 3.0


@pytest.mark.parametrize("text, reason", [
    ("{not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"runtime-hooks": []}', "remote-endpoint: missing"),
    ('{"remote-endpoint": 5, "runtime-hooks": []}', "remote-endpoint: missing"),
    ('{"remote-endpoint": "p.sock", "runtime-hooks": []}', "not an absolute"),
    ('{"remote-endpoint": "/p.sock", "runtime-hooks": "PreCreateContainer"}', "expected a list"),
    ('{"remote-endpoint": "/p.sock", "runtime-hooks": ["PreCreate"]}', "unknown hook 'PreCreate'"),
    ('{"remote-endpoint": "/p.sock", "runtime-hooks": [], "failure-policy": "fail"}', "neither Fail nor Ignore"),
    ('{"remote-endpoint": "/p.sock", "runtime-hooks": [], "timeout": "soon"}', "not a duration"),
    ('{"remote-endpoint": "/p.sock", "runtime-hooks": [], "timeout": 0}', "out of range"),
    ('{"remote-endpoint": "/p.sock", "runtime-hooks": [], "endpoint": "/x"}', "unknown key 'endpoint'"),
])
def test_parse_rejects_with_reason(text, reason):
    with pytest.raises(BadPlugin, match=reason):
        _spec(text)


def _write(path: Path, doc: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    os.replace(tmp, path)


async def _until(check, timeout: float = 1.0) -> float:
    """Seconds until check() holds (AssertionError after timeout)."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not true after {timeout}s")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def test_watched_directory_follows_every_change(tmp_path, caplog):
    caplog.set_level(logging.INFO, "cri-resmgr.hooks")
    hookdir = tmp_path / "hookserver.d"
    hooks = Hooks(str(hookdir))
    watch = asyncio.create_task(hooks.watch())
    try:
        await asyncio.sleep(0.1)
        hookdir.mkdir()  # the directory appears after the start
        doc = {"remote-endpoint": "/run/a.sock", "runtime-hooks": ["PreCreateContainer"]}
        _write(hookdir / "a.json", doc)
        await _until(lambda: "a" in hooks.plugins)
        (hookdir / "b.json").write_text(json.dumps({**doc, "remote-endpoint": "/run/b.sock"}))  # written in place
        await _until(lambda: "b" in hooks.plugins)
        assert list(hooks.plugins) == ["a", "b"]
        _write(hookdir / "a.json", {**doc, "failure-policy": "Fail"})
        await _until(lambda: hooks.plugins["a"].spec.failure_policy == FailurePolicy.FAIL)
        os.rename(hookdir / "a.json", hookdir / "c.json")
        await _until(lambda: "a" not in hooks.plugins and "c" in hooks.plugins)
        (hookdir / "b.json").unlink()
        await _until(lambda: list(hooks.plugins) == ["c"])

        # A bad file is reported once, however often the directory changes, and blocks nobody.
        _write(hookdir / "bad.json", '{"remote-endpoint": "/run/x.sock", "runtime-hooks": ["Nope"]}')
        for i in range(3):
            _write(hookdir / f"ok{i}.json", doc)
        await _until(lambda: list(hooks.plugins) == ["c", "ok0", "ok1", "ok2"])
        complaints = [r for r in caplog.records if "bad.json" in r.getMessage()]
        assert len(complaints) == 1 and "unknown hook 'Nope'" in complaints[0].getMessage()
        _write(hookdir / "bad.json", doc)  # fixed: registered
        await _until(lambda: "bad" in hooks.plugins)
        (hookdir / "notes.txt").write_text("not a registration")
        await asyncio.sleep(0.2)
        assert "notes" not in hooks.plugins
    finally:
        watch.cancel()
        await hooks.close()


async def test_directory_removed_and_made_again(tmp_path):
    hookdir = tmp_path / "d"
    hookdir.mkdir()
    doc = {"remote-endpoint": "/run/a.sock", "runtime-hooks": ["PreCreateContainer"]}
    _write(hookdir / "a.json", doc)
    hooks = Hooks(str(hookdir))
    watch = asyncio.create_task(hooks.watch())
    try:
        await _until(lambda: "a" in hooks.plugins)
        (hookdir / "a.json").unlink()
        hookdir.rmdir()
        await _until(lambda: not hooks.plugins)
        hookdir.mkdir()
        _write(hookdir / "b.json", doc)
        await _until(lambda: list(hooks.plugins) == ["b"])
    finally:
        watch.cancel()
        await hooks.close()


# -- the hook chain, against plugins served on real unix sockets ----------------------------

class Scripted(ExamplePlugin):
    """Records requests; answers per `answer` (a function of the request) or misbehaves."""

    def __init__(self, name: str, answer=None, mode: str = "answer") -> None:
        super().__init__(name)
        self.seen: list[pb.ContainerResourceHookRequest] = []
        self.answer, self.mode = answer, mode

    async def PreCreateContainerHook(self, request, context):
        self.seen.append(request)
        if self.mode == "hang":
            await asyncio.sleep(60)
        if self.mode == "error":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{self.name} refuses")
        return self.answer(request) if self.answer else self.adjust(request)


async def _plugins(tmp_path: Path, hooks: Hooks, plugins: list[tuple[str, Scripted, dict]]) -> list:
    servers = []
    specs = {}
    for name, servicer, extra in plugins:
        sock = str(tmp_path / f"{name}.sock")
        servers.append(await serve(sock, servicer))
        spec = parse(tmp_path / f"{name}.json", json.dumps(
            {"remote-endpoint": sock, "runtime-hooks": ["PreCreateContainer"], **extra}))
        specs[spec.name] = spec
    hooks._registered(specs)
    return servers


def _pod(**labels: str) -> Pod:
    return Pod(id="p1", uid="u1", name="web", namespace="ns", labels={"app": "web", **labels},
               cgroup_parent="/kubepods/burstable/podu1", resources=Resources(cpu_shares=512))


def _container() -> Container:
    res = Resources(cpu_shares=512, cpu_quota=100000, cpu_period=100000, cpuset_cpus="0-1")
    return Container(id="", pod_id="p1", name="app", env={"PATH": "/bin"}, annotations={"a": "1"},
                     requested=res, resources=res)


async def test_every_plugin_in_name_order_sees_the_changes_before_it(tmp_path):
    hooks = Hooks(str(tmp_path))

    def second(req):
        return pb.ContainerResourceHookResponse(container_envs={"SECOND": "2", "HOOKED_BY": "second"},
                                                container_resources=pb.LinuxContainerResources(cpu_shares=256))

    first, last = Scripted("first"), Scripted("second", second)
    servers = await _plugins(tmp_path, hooks, [("20-second", last, {}), ("10-first", first, {})])
    try:
        adj = await hooks.pre_create(_pod(**{"example.com/cpu-cap": "250m"}), _container(), pinned=True)
    finally:
        for s in servers:
            await s.stop(None)
        await hooks.close()
    assert len(first.seen) == len(last.seen) == 1
    seen = last.seen[0]
    assert seen.container_envs["HOOKED_BY"] == "first" and seen.container_resources.cpu_quota == 25000
    assert seen.container_annotations == {"a": "1", "example.com/hooked-by": "first"}
    assert dict(seen.pod_labels)["app"] == "web" and seen.pod_cgroup_parent == "/kubepods/burstable/podu1"
    assert seen.pod_resources.cpu_shares == 512 and seen.container_resources.cpuset_cpus == "0-1"
    assert adj.env == {"HOOKED_BY": "second", "SECOND": "2"}
    assert adj.annotations == {"example.com/hooked-by": "first"}
    assert adj.resources == Resources(cpu_quota=25000, cpu_shares=256)


async def test_pinning_stands_unless_allowed_and_empty_means_no_change(tmp_path, caplog):
    hooks = Hooks(str(tmp_path))

    def pin(req):
        return pb.ContainerResourceHookResponse(container_resources=pb.LinuxContainerResources(
            cpuset_cpus="1", cpuset_mems="", memory_limit_in_bytes=1 << 20))

    servers = await _plugins(tmp_path, hooks, [("pin", Scripted("pin", pin), {})])
    try:
        adj = await hooks.pre_create(_pod(), _container(), pinned=True)
        assert adj.resources == Resources(memory_limit_in_bytes=1 << 20)
        assert "asks for cpus '1'" in caplog.text
        adj = await hooks.pre_create(_pod(), _container(), pinned=False)  # the none policy: koord's behaviour
        assert adj.resources == Resources(memory_limit_in_bytes=1 << 20, cpuset_cpus="1")
        hooks.configure({"AllowPinningOverride": True})
        adj = await hooks.pre_create(_pod(), _container(), pinned=True)
        assert adj.resources.cpuset_cpus == "1"
    finally:
        for s in servers:
            await s.stop(None)
        await hooks.close()


async def test_an_echoed_request_changes_nothing(tmp_path):
    hooks = Hooks(str(tmp_path))

    def echo(req):
        return pb.ContainerResourceHookResponse(container_annotations=req.container_annotations,
                                                container_resources=req.container_resources,
                                                container_envs=req.container_envs,
                                                pod_cgroup_parent=req.pod_cgroup_parent)

    servers = await _plugins(tmp_path, hooks, [("echo", Scripted("echo", echo), {})])
    try:
        assert not await hooks.pre_create(_pod(), _container(), pinned=True)
    finally:
        for s in servers:
            await s.stop(None)
        await hooks.close()


async def test_failure_policies_timeouts_and_deadlines(tmp_path):
    hooks = Hooks(str(tmp_path))
    hang, err = Scripted("hang", mode="hang"), Scripted("err", mode="error")
    servers = await _plugins(tmp_path, hooks, [("a-hang", hang, {"timeout": "200ms"}), ("b-err", err, {})])
    try:
        started = time.monotonic()
        adj = await hooks.pre_create(_pod(), _container(), pinned=True)  # both Ignore: nothing changes
        assert not adj and 0.19 < time.monotonic() - started < 1.0
        hooks._registered({**{n: p.spec for n, p in hooks.plugins.items()},
                           "b-err": parse(tmp_path / "b-err.json", json.dumps({
                               "remote-endpoint": hooks.plugins["b-err"].spec.endpoint,
                               "runtime-hooks": ["PreCreateContainer"], "failure-policy": "Fail"}))})
        with pytest.raises(HookFailed) as info:
            await hooks.pre_create(_pod(), _container(), pinned=True)
        assert (info.value.plugin, info.value.code) == ("b-err", "PERMISSION_DENIED")
        assert "b-err failed in PreCreateContainer" in str(info.value) and "err refuses" in str(info.value)
        # The lifecycle call's deadline bounds a plugin's own, longer timeout.
        hooks._registered({"a-hang": parse(tmp_path / "a-hang.json", json.dumps({
            "remote-endpoint": hooks.plugins["a-hang"].spec.endpoint, "runtime-hooks": ["PreCreateContainer"],
            "failure-policy": "Fail", "timeout": 30}))})
        started = time.monotonic()
        with pytest.raises(HookFailed) as info:
            await hooks.pre_create(_pod(), _container(), pinned=True, deadline=time.monotonic() + 0.3)
        assert info.value.code == "DEADLINE_EXCEEDED" and time.monotonic() - started < 1.0
    finally:
        for s in servers:
            await s.stop(None)
        await hooks.close()


async def test_skip_label_and_a_plugin_that_comes_back(tmp_path):
    hooks = Hooks(str(tmp_path), skip_label=("infra", "yes"))
    plugin = Scripted("p")
    sock = str(tmp_path / "p.sock")
    hooks._registered({"p": parse(tmp_path / "p.json", json.dumps(
        {"remote-endpoint": sock, "runtime-hooks": ["PreCreateContainer"], "failure-policy": "Fail"}))})
    try:
        with pytest.raises(HookFailed) as info:  # not running yet
            await hooks.pre_create(_pod(), _container(), pinned=True)
        assert info.value.code == "UNAVAILABLE"
        assert not await hooks.pre_create(_pod(infra="yes"), _container(), pinned=True)  # skipped: never called
        server = await serve(sock, plugin)
        adj = await hooks.pre_create(_pod(), _container(), pinned=True)  # retried at once
        assert adj.env == {"HOOKED_BY": "p"} and len(plugin.seen) == 1
        await server.stop(None)
    finally:
        await hooks.close()


def test_koord_runtime_proxy_flags_are_accepted():
    from resmgr.app.cli import build_parser

    args = build_parser().parse_args([
        "--koord-runtimeproxy-endpoint", "/var/run/koord-runtimeproxy/runtimeproxy.sock",
        "--remote-runtime-service-endpoint", "unix:///run/containerd/containerd.sock",
        "--remote-image-service-endpoint", "/run/images.sock", "--backend-runtime-mode", "Containerd",
        "--runtime-hook-server-key", "infra", "--runtime-hook-server-val", "yes"])
    assert args.relay_socket == "/var/run/koord-runtimeproxy/runtimeproxy.sock"
    assert (args.runtime_socket, args.image_socket) == ("unix:///run/containerd/containerd.sock", "/run/images.sock")
    assert (args.hook_skip_key, args.hook_skip_value, args.hook_dir) == ("infra", "yes", "/etc/runtime/hookserver.d")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--backend-runtime-mode", "Docker"])


def test_hooks_configuration_section():
    from resmgr.config import ConfigError, from_map, validate

    assert validate({"hooks": {"AllowPinningOverride": True}}).data["hooks"] == {"AllowPinningOverride": True}
    with pytest.raises(ConfigError, match="hooks.AllowPinningOverride"):
        validate({"hooks": {"AllowPinningOverride": "yes"}})
    with pytest.raises(ConfigError, match="hooks.Timeout: unknown key"):
        from_map({"hooks": "Timeout: 2s"})
    hooks = Hooks("/nonexistent")
    hooks.configure(from_map({"hooks.AllowPinningOverride": "true"}).data["hooks"])
    assert hooks.allow_pinning_override
