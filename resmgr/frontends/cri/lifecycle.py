"""CRI lifecycle calls translated into engine calls and runtime hook plugin calls.

Each method takes the parsed request, `send`, which performs the runtime call (the
relay's), and the call's deadline (time.monotonic(), None: none), and returns the
runtime's reply. Requests are turned into model objects here, the engine decides, the
hook plugins see (and may change) the result, and both are written back into the
request before it is sent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from resmgr.engine import Engine
from resmgr.frontends.cri import convert
from resmgr.generated.cri import api_pb2 as cri
from resmgr.hooks import Hook, HookFailed, Hooks
from resmgr.model import Adjustment

Send = Callable[[Any], Awaitable[Any]]
Handler = Callable[[Any, Send, float | None], Awaitable[Any]]

# Status codes (by name) meaning the runtime refused a call without doing anything; after any
# other failure the call may or may not have happened.
_REFUSALS = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED",
                       "FAILED_PRECONDITION", "OUT_OF_RANGE", "UNIMPLEMENTED", "RESOURCE_EXHAUSTED",
                       "UNAUTHENTICATED"})


def refused(err: BaseException) -> bool:
    """Whether a failed runtime call certainly changed nothing."""
    code = getattr(err, "code", None)
    code = code() if callable(code) else code
    return getattr(code, "name", None) in _REFUSALS


class CriLifecycle:
    def __init__(self, engine: Engine, hooks: Hooks | None = None) -> None:
        self.engine = engine
        self.hooks = hooks

    def calls(self) -> dict[str, Handler]:
        """The RuntimeService methods handled here, by gRPC path."""
        base = "/runtime.v1.RuntimeService/"
        return {
            base + "RunPodSandbox": self.run_pod_sandbox,
            base + "StopPodSandbox": self.stop_pod_sandbox,
            base + "RemovePodSandbox": self.remove_pod_sandbox,
            base + "CreateContainer": self.create_container,
            base + "StartContainer": self.start_container,
            base + "UpdateContainerResources": self.update_container_resources,
            base + "StopContainer": self.stop_container,
            base + "RemoveContainer": self.remove_container,
        }

    async def run_pod_sandbox(self, req: cri.RunPodSandboxRequest, send: Send,
                              deadline: float | None = None) -> cri.RunPodSandboxResponse:
        if self.hooks is not None:
            adj = await self.hooks.pre_run_pod(convert.pod_from_config("", req.config, req.runtime_handler), deadline)
            if adj:
                _apply_pod(req.config, adj)
        resp = await send(req)
        await self.engine.pod_created(convert.pod_from_config(resp.pod_sandbox_id, req.config, req.runtime_handler))
        return resp

    async def stop_pod_sandbox(self, req: cri.StopPodSandboxRequest, send: Send,
                               deadline: float | None = None) -> cri.StopPodSandboxResponse:
        pod = self.engine.pods.get(req.pod_sandbox_id)
        resp = await self.engine.stop_pod(req.pod_sandbox_id, lambda: send(req))
        if self.hooks is not None and pod is not None:
            await self.hooks.post_stop_pod(pod, deadline)
        return resp

    async def remove_pod_sandbox(self, req: cri.RemovePodSandboxRequest, send: Send,
                                 deadline: float | None = None) -> cri.RemovePodSandboxResponse:
        return await self.engine.remove_pod(req.pod_sandbox_id, lambda: send(req))

    async def create_container(self, req: cri.CreateContainerRequest, send: Send,
                               deadline: float | None = None) -> cri.CreateContainerResponse:
        pod = convert.pod_from_config(req.pod_sandbox_id, req.sandbox_config)
        container = convert.container_from_config(req.pod_sandbox_id, req.config)
        plan = await self.engine.plan_create(pod, container, [d.host_path for d in req.config.devices])
        if plan.decided:
            convert.to_linux(plan.container.resources, req.config.linux.resources)
        try:
            if self.hooks is not None:
                adj = await self.hooks.pre_create(plan.pod, plan.container, plan.pinned, deadline)
                if adj:
                    self.engine.amend_create(plan, adj)
                    _apply_container(req, adj, plan.container.resources)
            resp = await send(req)
        except BaseException as err:
            await self.engine.abort_create(plan, err, refused(err) or isinstance(err, HookFailed))
            raise
        await self.engine.commit_create(plan, resp.container_id)
        return resp

    async def start_container(self, req: cri.StartContainerRequest, send: Send,
                              deadline: float | None = None) -> cri.StartContainerResponse:
        known = self.engine.context(req.container_id) if self.hooks is not None else None
        if self.hooks is not None and known is not None:
            pod, c = known
            adj = await self.hooks.pre_start(pod, c, self.engine.pins(c), deadline)
            if adj.resources is not None:
                await self.engine.adjust(c.id, adj.resources)
        resp = await self.engine.start_container(req.container_id, lambda: send(req))
        if self.hooks is not None and known is not None:
            await self.hooks.post_start(*known, deadline)
        return resp

    async def update_container_resources(self, req: cri.UpdateContainerResourcesRequest, send: Send,
                                         deadline: float | None = None) -> cri.UpdateContainerResourcesResponse:
        if not req.HasField("linux"):
            return await send(req)
        plain = not req.annotations and not req.HasField("windows") and convert.only_modelled(req.linux)
        plan = await self.engine.plan_update(req.container_id, convert.resources(req.linux), plain)
        if plan is None:
            return await send(req)
        hooked = self.hooks is not None and bool(self.hooks.for_hook(Hook.PRE_UPDATE_CONTAINER_RESOURCES, plan.pod))
        if plan.resources is None and not hooked:
            return cri.UpdateContainerResourcesResponse()
        resources = plan.resources or plan.container.resources
        convert.to_linux(resources, req.linux)
        adjusted = None
        try:
            if hooked:
                assert self.hooks is not None
                c = dataclasses.replace(plan.container, resources=resources)
                adj = await self.hooks.pre_update(plan.pod, c, plan.pinned, deadline)
                req.annotations.update(adj.annotations)
                if adj.resources is not None:
                    adjusted = adj.resources
                    convert.to_linux(resources.overlaid(adj.resources), req.linux)
            resp = await send(req)
        except BaseException:
            await self.engine.abort_update(plan)
            raise
        await self.engine.commit_update(plan, convert.resources(req.linux), adjusted)
        return resp

    async def stop_container(self, req: cri.StopContainerRequest, send: Send,
                             deadline: float | None = None) -> cri.StopContainerResponse:
        known = self.engine.context(req.container_id) if self.hooks is not None else None
        resp = await self.engine.stop_container(req.container_id, lambda: send(req))
        if self.hooks is not None and known is not None:
            await self.hooks.post_stop(*known, deadline)
        return resp

    async def remove_container(self, req: cri.RemoveContainerRequest, send: Send,
                               deadline: float | None = None) -> cri.RemoveContainerResponse:
        return await self.engine.remove_container(req.container_id, lambda: send(req))


def _apply_pod(config: cri.PodSandboxConfig, adj: Adjustment) -> None:
    """A PreRunPodSandbox adjustment: labels and annotations merged, cgroup parent and resources replaced."""
    config.labels.update(adj.labels)
    config.annotations.update(adj.annotations)
    if adj.cgroup_parent:
        config.linux.cgroup_parent = adj.cgroup_parent
    if adj.resources is not None:
        current = convert.resources(config.linux.resources if config.linux.HasField("resources") else None)
        convert.to_linux(current.overlaid(adj.resources), config.linux.resources)


def _apply_container(req: cri.CreateContainerRequest, adj: Adjustment, resources: Any) -> None:
    """A PreCreateContainer adjustment: annotations and environment merged, resources and the
    sandbox's cgroup parent replaced."""
    req.config.annotations.update(adj.annotations)
    if adj.env:
        env = convert.envs(req.config)
        if any(k in env for k in adj.env) or len(env) != len(req.config.envs):
            env.update(adj.env)
            convert.set_envs(req.config, env)
        else:  # only new names: append, the request's own list stays as it was
            for key, value in adj.env.items():
                req.config.envs.add(key=key, value=value.encode())
    if adj.resources is not None:
        convert.to_linux(resources, req.config.linux.resources)
    if adj.cgroup_parent:
        req.sandbox_config.linux.cgroup_parent = adj.cgroup_parent
