"""The engine's own client for calls it makes to the runtime (reconcile, updates)."""

from __future__ import annotations

import grpc

from resmgr.cri import api_pb2 as cri
from resmgr.cri import api_pb2_grpc as cri_grpc

CALL_TIMEOUT = 10.0


class RuntimeClient:
    def __init__(self, channel: grpc.aio.Channel, timeout: float = CALL_TIMEOUT) -> None:
        self.stub = cri_grpc.RuntimeServiceStub(channel)
        self.timeout = timeout

    async def version(self) -> cri.VersionResponse:
        return await self.stub.Version(cri.VersionRequest(version="v1"), timeout=self.timeout)

    async def list_pods(self) -> list[cri.PodSandbox]:
        resp = await self.stub.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=self.timeout)
        return list(resp.items)

    async def pod_status(self, pod_id: str) -> cri.PodSandboxStatusResponse:
        return await self.stub.PodSandboxStatus(
            cri.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True), timeout=self.timeout)

    async def list_containers(self) -> list[cri.Container]:
        resp = await self.stub.ListContainers(cri.ListContainersRequest(), timeout=self.timeout)
        return list(resp.containers)

    async def container_status(self, container_id: str) -> cri.ContainerStatusResponse:
        return await self.stub.ContainerStatus(
            cri.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=self.timeout)

    async def update_resources(self, container_id: str, res: cri.LinuxContainerResources) -> None:
        await self.stub.UpdateContainerResources(
            cri.UpdateContainerResourcesRequest(container_id=container_id, linux=res),
            timeout=self.timeout)
