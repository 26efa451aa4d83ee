"""CRI lifecycle calls translated into engine calls and runtime hook plugin calls.

Each method takes the parsed request, `send`, which performs the runtime call (the
relay's), and the call's deadline (time.monotonic(), None: none), and returns the
runtime's reply. Requests are turned into model objects here; the engine's Calls
(resmgr/engine/calls.py) run the decision, the hook plugins and the runtime call; what
they decided is written into the request before it is sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from resmgr.engine import Engine
from resmgr.engine.calls import Calls, HookPoints
from resmgr.engine.create import CreatePlan
from resmgr.frontends.cri import convert
from resmgr.generated.cri import api_pb2 as cri
from resmgr.model import Adjustment, Pod, Resources

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
    def __init__(self, engine: Engine, hooks: HookPoints | None = None) -> None:
        self.calls = Calls(engine, hooks)

    def handlers(self) -> dict[str, Handler]:
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
        async def call(adj: Adjustment | None) -> tuple[cri.RunPodSandboxResponse, Pod]:
            if adj is not None:
                _apply_pod(req.config, adj)
            resp = await send(req)
            return resp, convert.pod_from_config(resp.pod_sandbox_id, req.config, req.runtime_handler)

        asked = convert.pod_from_config("", req.config, req.runtime_handler)
        return await self.calls.run_pod(asked, call, deadline)

    async def stop_pod_sandbox(self, req: cri.StopPodSandboxRequest, send: Send,
                               deadline: float | None = None) -> cri.StopPodSandboxResponse:
        return await self.calls.stop_pod(req.pod_sandbox_id, lambda: send(req), deadline)

    async def remove_pod_sandbox(self, req: cri.RemovePodSandboxRequest, send: Send,
                                 deadline: float | None = None) -> cri.RemovePodSandboxResponse:
        return await self.calls.remove_pod(req.pod_sandbox_id, lambda: send(req))

    async def create_container(self, req: cri.CreateContainerRequest, send: Send,
                               deadline: float | None = None) -> cri.CreateContainerResponse:
        async def call(plan: CreatePlan, adj: Adjustment | None) -> tuple[cri.CreateContainerResponse, str]:
            if plan.decided or (adj is not None and adj.resources is not None):
                convert.to_linux(plan.container.resources, req.config.linux.resources)
            if adj is not None:
                _apply_container(req, adj)
            resp = await send(req)
            return resp, resp.container_id

        pod = convert.pod_from_config(req.pod_sandbox_id, req.sandbox_config)
        container = convert.container_from_config(req.pod_sandbox_id, req.config)
        resp, _ = await self.calls.create_container(pod, container, call, refused,
                                                     [d.host_path for d in req.config.devices], deadline)
        return resp

    async def start_container(self, req: cri.StartContainerRequest, send: Send,
                              deadline: float | None = None) -> cri.StartContainerResponse:
        return await self.calls.start_container(req.container_id, lambda: send(req), deadline)

    async def update_container_resources(self, req: cri.UpdateContainerResourcesRequest, send: Send,
                                         deadline: float | None = None) -> cri.UpdateContainerResourcesResponse:
        if not req.HasField("linux"):
            return await send(req)

        async def call(resources: Resources, adj: Adjustment | None) -> tuple[cri.UpdateContainerResourcesResponse,
                                                                               Resources]:
            if adj is not None:
                req.annotations.update(adj.annotations)
            convert.to_linux(resources.overlaid(adj.resources if adj is not None else None), req.linux)
            return await send(req), convert.resources(req.linux)

        plain = not req.annotations and not req.HasField("windows") and convert.only_modelled(req.linux)
        return await self.calls.update_container(req.container_id, convert.resources(req.linux), plain, call,
                                                  lambda: send(req), cri.UpdateContainerResourcesResponse, deadline)

    async def stop_container(self, req: cri.StopContainerRequest, send: Send,
                             deadline: float | None = None) -> cri.StopContainerResponse:
        return await self.calls.stop_container(req.container_id, lambda: send(req), deadline)

    async def remove_container(self, req: cri.RemoveContainerRequest, send: Send,
                               deadline: float | None = None) -> cri.RemoveContainerResponse:
        return await self.calls.remove_container(req.container_id, lambda: send(req))


def _apply_pod(config: cri.PodSandboxConfig, adj: Adjustment) -> None:
    """A PreRunPodSandbox adjustment: labels and annotations merged, cgroup parent and resources replaced."""
    config.labels.update(adj.labels)
    config.annotations.update(adj.annotations)
    if adj.cgroup_parent:
        config.linux.cgroup_parent = adj.cgroup_parent
    if adj.resources is not None:
        current = convert.resources(config.linux.resources if config.linux.HasField("resources") else None)
        convert.to_linux(current.overlaid(adj.resources), config.linux.resources)


def _apply_container(req: cri.CreateContainerRequest, adj: Adjustment) -> None:
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
    if adj.cgroup_parent:
        req.sandbox_config.linux.cgroup_parent = adj.cgroup_parent
