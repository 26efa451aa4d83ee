"""CRI lifecycle calls translated into engine calls.

Each method takes the parsed request and `send`, which performs the runtime call (the
relay's), and returns the runtime's reply. Requests are turned into model objects here,
the engine decides, and its decision is written back into the request before it is sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from resmgr.cri import convert
from resmgr.engine import Engine
from resmgr.generated.cri import api_pb2 as cri

Send = Callable[[Any], Awaitable[Any]]

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
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def calls(self) -> dict[str, Callable[[Any, Send], Awaitable[Any]]]:
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

    async def run_pod_sandbox(self, req: cri.RunPodSandboxRequest, send: Send) -> cri.RunPodSandboxResponse:
        resp = await send(req)
        await self.engine.pod_created(convert.pod_from_config(resp.pod_sandbox_id, req.config, req.runtime_handler))
        return resp

    async def stop_pod_sandbox(self, req: cri.StopPodSandboxRequest, send: Send) -> cri.StopPodSandboxResponse:
        return await self.engine.stop_pod(req.pod_sandbox_id, lambda: send(req))

    async def remove_pod_sandbox(self, req: cri.RemovePodSandboxRequest,
                                 send: Send) -> cri.RemovePodSandboxResponse:
        return await self.engine.remove_pod(req.pod_sandbox_id, lambda: send(req))

    async def create_container(self, req: cri.CreateContainerRequest, send: Send) -> cri.CreateContainerResponse:
        pod = convert.pod_from_config(req.pod_sandbox_id, req.sandbox_config)
        container = convert.container_from_config(req.pod_sandbox_id, req.config)
        plan = await self.engine.plan_create(pod, container, [d.host_path for d in req.config.devices])
        if plan.decided:
            convert.to_linux(plan.container.resources, req.config.linux.resources)
        try:
            resp = await send(req)
        except BaseException as err:
            await self.engine.abort_create(plan, err, refused(err))
            raise
        await self.engine.commit_create(plan, resp.container_id)
        return resp

    async def start_container(self, req: cri.StartContainerRequest, send: Send) -> cri.StartContainerResponse:
        return await self.engine.start_container(req.container_id, lambda: send(req))

    async def update_container_resources(self, req: cri.UpdateContainerResourcesRequest,
                                         send: Send) -> cri.UpdateContainerResourcesResponse:
        if not req.HasField("linux"):
            return await send(req)
        plain = not req.annotations and not req.HasField("windows") and convert.only_modelled(req.linux)
        plan = await self.engine.plan_update(req.container_id, convert.resources(req.linux), plain)
        if plan is None:
            return await send(req)
        if plan.resources is None:
            return cri.UpdateContainerResourcesResponse()
        convert.to_linux(plan.resources, req.linux)
        try:
            resp = await send(req)
        except BaseException:
            await self.engine.abort_update(plan)
            raise
        await self.engine.commit_update(plan, convert.resources(req.linux))
        return resp

    async def stop_container(self, req: cri.StopContainerRequest, send: Send) -> cri.StopContainerResponse:
        return await self.engine.stop_container(req.container_id, lambda: send(req))

    async def remove_container(self, req: cri.RemoveContainerRequest, send: Send) -> cri.RemoveContainerResponse:
        return await self.engine.remove_container(req.container_id, lambda: send(req))
