"""Calling the runtime hook plugins at the seven hook points, in model terms.

Every plugin registered for a hook is called, in file-name order, each seeing the request
as the ones before it left it. Each call is bounded by the plugin's timeout and by the
deadline of the lifecycle call it belongs to. A Pre hook's failure fails the lifecycle
call when the plugin's failure policy is Fail (HookFailed) and is logged, its changes
dropped, when it is Ignore; Post hooks never fail a call. A plugin that is down is
reconnected at its next call. Front ends turn the returned Adjustment into their protocol.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from resmgr import metrics
from resmgr.hooks import messages
from resmgr.hooks.registry import DEFAULT_TIMEOUT, FailurePolicy, Hook, PluginSpec, Registry
from resmgr.model import Adjustment, Container, Pod, Resources

if TYPE_CHECKING:
    import grpc

    from resmgr.generated.hooks import api_pb2_grpc as pb_grpc

log = logging.getLogger("cri-resmgr.hooks")

SKIP_LABEL = ("runtimeproxy.koordinator.sh/skip-hookserver", "true")
_PINNING = ("cpuset_cpus", "cpuset_mems")
# A channel of its own subchannel: a new one after a failure must not inherit the old backoff.
_CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1), ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000)]


class HookFailed(Exception):
    """A Pre hook failed under failure policy Fail: the lifecycle call must fail."""

    def __init__(self, plugin: str, hook: Hook, code: str, details: str) -> None:
        self.plugin, self.hook, self.code, self.details = plugin, hook, code, details
        super().__init__(f"runtime hook plugin {plugin} failed in {hook} (failure-policy Fail): {code}: {details}")


class PluginError(Exception):
    def __init__(self, code: str, details: str) -> None:
        self.code, self.details = code, details
        super().__init__(f"{code}: {details}")


class Plugin:
    """One registered plugin and its gRPC channel (opened at the first call, again after a failure).

    gRPC is loaded with the first plugin registered, not at start: a daemon without hook plugins
    (the NRI plugin, most often) then loads no gRPC at all, about 10 MB less at rest."""

    def __init__(self, spec: PluginSpec) -> None:
        import grpc  # noqa: F401 - loaded now rather than at the first lifecycle call

        from resmgr.generated.hooks import api_pb2_grpc  # noqa: F401

        self.spec = spec
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.RuntimeHookServiceStub | None = None

    def _connect(self) -> pb_grpc.RuntimeHookServiceStub:
        import grpc

        from resmgr.generated.hooks import api_pb2_grpc as pb_grpc

        if self._stub is None:
            self._channel = grpc.aio.insecure_channel("unix://" + self.spec.endpoint, options=_CHANNEL_OPTIONS)
            self._stub = pb_grpc.RuntimeHookServiceStub(self._channel)
        return self._stub

    async def call(self, hook: Hook, request: Any, timeout: float) -> Any:
        import grpc

        method = getattr(self._connect(), f"{hook.value}Hook")
        try:
            return await method(request, timeout=timeout)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                self.retire()  # down or restarted: the next call connects afresh
            raise PluginError(err.code().name, err.details() or "") from None

    def retire(self, grace: float = 0.0) -> None:
        """Close the channel once calls still on it had time to finish."""
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            task = asyncio.get_running_loop().create_task(_close_later(channel, grace))
            _closing.add(task)
            task.add_done_callback(_closing.discard)


_closing: set[asyncio.Task[None]] = set()


async def _close_later(channel: grpc.aio.Channel, grace: float) -> None:
    await asyncio.sleep(grace)
    await channel.close()


def _copy_pod(pod: Pod) -> Pod:
    return dataclasses.replace(pod, labels=dict(pod.labels), annotations=dict(pod.annotations))


def _copy_container(c: Container) -> Container:
    return dataclasses.replace(c, annotations=dict(c.annotations), env=dict(c.env),
                               resources=dataclasses.replace(c.resources))


def _new_only(adj: Adjustment, labels: dict[str, str], annotations: dict[str, str], env: dict[str, str],
              res: Resources, cgroup_parent: str) -> Adjustment:
    """adj without what it sets to the value the request already had (an echoed request changes nothing)."""
    changed = None
    if adj.resources is not None:
        fields = {k: v for k, v in adj.resources.to_dict().items() if getattr(res, k) != v}
        if "unified" in fields:
            fields["unified"] = {k: v for k, v in fields["unified"].items() if res.unified.get(k) != v}
        if "hugepage_limits" in fields:
            fields["hugepage_limits"] = {k: v for k, v in fields["hugepage_limits"].items()
                                         if res.hugepage_limits.get(k) != v}
        changed = Resources.from_dict({k: v for k, v in fields.items() if v}) if fields else None
        changed = changed if changed is not None and changed.to_dict() else None
    return Adjustment(
        labels={k: v for k, v in adj.labels.items() if labels.get(k) != v},
        annotations={k: v for k, v in adj.annotations.items() if annotations.get(k) != v},
        env={k: v for k, v in adj.env.items() if k not in env or messages.text(env[k]) != v},
        resources=changed, cgroup_parent=adj.cgroup_parent if adj.cgroup_parent != cgroup_parent else "")


class Hooks:
    """The registered plugins and the seven hook points."""

    def __init__(self, directory: str, skip_label: tuple[str, str] = SKIP_LABEL,
                 default_timeout: float = DEFAULT_TIMEOUT) -> None:
        self.skip_label = skip_label
        self.allow_pinning_override = False
        self.plugins: dict[str, Plugin] = {}
        self.registry = Registry(directory, self._registered, default_timeout)

    # -- registrations -----------------------------------------------------------------
    def configure(self, section: dict[str, Any]) -> None:
        """The `hooks` configuration section (validated): whether plugins may change the policy's pinning."""
        self.allow_pinning_override = bool(section.get("AllowPinningOverride", False))

    def _registered(self, specs: dict[str, PluginSpec]) -> None:
        for name in list(self.plugins):
            if name not in specs:
                old = self.plugins.pop(name)
                old.retire(old.spec.timeout)
        for name, spec in specs.items():
            plugin = self.plugins.get(name)
            if plugin is not None and plugin.spec.endpoint != spec.endpoint:
                plugin.retire(plugin.spec.timeout)
                plugin = None
            if plugin is None:
                self.plugins[name] = Plugin(spec)
            else:
                plugin.spec = spec
        self.plugins = dict(sorted(self.plugins.items()))

    async def watch(self) -> None:
        await self.registry.watch()

    async def close(self) -> None:
        for plugin in self.plugins.values():
            plugin.retire()
        if _closing:
            await asyncio.gather(*_closing, return_exceptions=True)

    def skipped(self, pod: Pod) -> bool:
        key, value = self.skip_label
        return pod.labels.get(key) == value

    def for_hook(self, hook: Hook, pod: Pod) -> list[Plugin]:
        """The plugins to call at hook for a pod, in order (none for a pod with the skip label)."""
        plugins = [p for p in self.plugins.values() if hook in p.spec.hooks]
        return [] if not plugins or self.skipped(pod) else plugins

    # -- hook points -------------------------------------------------------------------
    async def pre_run_pod(self, pod: Pod, deadline: float | None = None) -> Adjustment:
        total = Adjustment()
        now = _copy_pod(pod)
        for plugin in self.for_hook(Hook.PRE_RUN_POD_SANDBOX, pod):
            resp = await self._call(plugin, Hook.PRE_RUN_POD_SANDBOX, messages.pod_request(now), deadline, pod.name)
            if resp is None:
                continue
            adj = _new_only(messages.pod_adjustment(resp), now.labels, now.annotations, {}, now.resources,
                            now.cgroup_parent)
            now.labels.update(adj.labels)
            now.annotations.update(adj.annotations)
            now.cgroup_parent = adj.cgroup_parent or now.cgroup_parent
            now.resources = now.resources.overlaid(adj.resources)
            total = total.then(adj)
        return total

    async def post_stop_pod(self, pod: Pod, deadline: float | None = None) -> None:
        for plugin in self.for_hook(Hook.POST_STOP_POD_SANDBOX, pod):
            await self._call(plugin, Hook.POST_STOP_POD_SANDBOX, messages.pod_request(pod), deadline, pod.name)

    async def pre_create(self, pod: Pod, c: Container, pinned: bool, deadline: float | None = None) -> Adjustment:
        """pinned: the policy set the container's CPUs and memory nodes."""
        return await self._container_chain(Hook.PRE_CREATE_CONTAINER, pod, c, pinned, deadline)

    async def pre_start(self, pod: Pod, c: Container, pinned: bool, deadline: float | None = None) -> Adjustment:
        return await self._container_chain(Hook.PRE_START_CONTAINER, pod, c, pinned, deadline)

    def wants_update(self, pod: Pod) -> bool:
        """Whether a plugin is to see the pod's resource updates (else one that changes nothing is answered
        without the runtime)."""
        return bool(self.for_hook(Hook.PRE_UPDATE_CONTAINER_RESOURCES, pod))

    async def pre_update(self, pod: Pod, c: Container, pinned: bool, deadline: float | None = None) -> Adjustment:
        return await self._container_chain(Hook.PRE_UPDATE_CONTAINER_RESOURCES, pod, c, pinned, deadline)

    async def post_start(self, pod: Pod, c: Container, deadline: float | None = None) -> None:
        await self._container_chain(Hook.POST_START_CONTAINER, pod, c, False, deadline)

    async def post_stop(self, pod: Pod, c: Container, deadline: float | None = None) -> None:
        await self._container_chain(Hook.POST_STOP_CONTAINER, pod, c, False, deadline)

    async def _container_chain(self, hook: Hook, pod: Pod, c: Container, pinned: bool,
                               deadline: float | None) -> Adjustment:
        plugins = self.for_hook(hook, pod)
        total = Adjustment()
        if not plugins:
            return total
        pod_now, now = _copy_pod(pod), _copy_container(c)
        what = f"{pod.namespace}/{pod.name}/{c.name}"
        for plugin in plugins:
            resp = await self._call(plugin, hook, messages.container_request(pod_now, now), deadline, what)
            if resp is None or not hook.pre:
                continue
            adj = _new_only(messages.container_adjustment(resp), {}, now.annotations, now.env, now.resources,
                            pod_now.cgroup_parent)
            if pinned and not self.allow_pinning_override:
                self._keep_pinning(adj, plugin, hook, what)
            now.annotations.update(adj.annotations)
            now.env.update(adj.env)
            now.resources = now.resources.overlaid(adj.resources)
            pod_now.cgroup_parent = adj.cgroup_parent or pod_now.cgroup_parent
            total = total.then(adj)
        return total

    @staticmethod
    def _keep_pinning(adj: Adjustment, plugin: Plugin, hook: Hook, what: str) -> None:
        res = adj.resources
        if res is None or not any(getattr(res, f) for f in _PINNING):
            return
        log.warning("%s: runtime hook plugin %s in %s asks for cpus %r mems %r; ignored, the policy's pinning "
                    "stands (hooks.AllowPinningOverride lets plugins change it)", what, plugin.spec.name, hook,
                    res.cpuset_cpus, res.cpuset_mems)
        res.cpuset_cpus = res.cpuset_mems = ""
        if not res.to_dict():
            adj.resources = None

    async def _call(self, plugin: Plugin, hook: Hook, request: Any, deadline: float | None, what: str) -> Any:
        """One plugin's answer; None when it failed and its failure is only logged."""
        timeout = plugin.spec.timeout
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
        started = time.perf_counter()
        try:
            if timeout <= 0:
                raise PluginError("DEADLINE_EXCEEDED", "no time left before the lifecycle call's deadline")
            resp = await plugin.call(hook, request, timeout)
        except PluginError as err:
            metrics.hook_call(plugin.spec.name, hook.value, err.code, time.perf_counter() - started)
            fail = hook.pre and plugin.spec.failure_policy == FailurePolicy.FAIL
            log.log(logging.ERROR if fail else logging.WARNING, "%s: runtime hook plugin %s failed in %s after "
                    "%.3fs: %s%s", what, plugin.spec.name, hook, time.perf_counter() - started, err,
                    "" if fail else "; going on without it")
            if fail:
                raise HookFailed(plugin.spec.name, hook, err.code, err.details) from None
            return None
        metrics.hook_call(plugin.spec.name, hook.value, "OK", time.perf_counter() - started)
        log.debug("%s: runtime hook plugin %s answered %s in %.3fs", what, plugin.spec.name, hook,
                  time.perf_counter() - started)
        return resp
