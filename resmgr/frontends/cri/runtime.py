"""The engine's own calls to a CRI runtime (reconcile, updates): a CRI client and its model adapter.

Replies are read with `protowire.parse`, so a pod or container whose strings are not
UTF-8 (a runtime may hold such, created behind our back) is read with the bad bytes
replaced instead of failing the whole listing.
"""

from __future__ import annotations

import logging
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from resmgr import cdi
from resmgr.frontends.cri import convert, protowire
from resmgr.generated.cri import api_pb2 as cri
from resmgr.model import Container, Pod, Resources, Stopped, qos_class_from_cgroup_parent

log = logging.getLogger("cri-resmgr.engine")

CALL_TIMEOUT = 10.0
STOPPED = "cannot update a stopped container"  # containerd's refusal of an update
_SERVICE = "/runtime.v1.RuntimeService/"

M = TypeVar("M", bound=Message)


class RuntimeClient:
    def __init__(self, channel: grpc.aio.Channel, timeout: float = CALL_TIMEOUT) -> None:
        self.channel = channel
        self.timeout = timeout
        self._calls: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}
        self._warned: set[str] = set()

    async def _call(self, method: str, request: Message, reply: type[M]) -> M:
        call = self._calls.get(method)
        if call is None:
            call = self._calls[method] = self.channel.unary_unary(
                _SERVICE + method, request_serializer=type(request).SerializeToString)
        raw = await call(request, timeout=self.timeout)
        try:
            msg, bad = protowire.parse(reply, raw)
        except DecodeError as err:
            raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details=f"{method} reply does not parse: {err}") from None
        if bad:
            self._warn_repaired(method, msg, bad)
        return msg

    def _warn_repaired(self, method: str, msg: Message, bad: list[str]) -> None:
        items = getattr(msg, "containers", None) or getattr(msg, "items", None)
        for path in bad:
            owner = method
            if items is not None and path.startswith(("containers[", "items[")):
                index = int(path[path.index("[") + 1:path.index("]")])
                owner = f"{method}: {items[index].id}"
            if owner not in self._warned:
                self._warned.add(owner)
                log.warning("%s: runtime data holds bytes that are not UTF-8 (%s); read with them replaced",
                            owner, path)

    async def version(self) -> cri.VersionResponse:
        return await self._call("Version", cri.VersionRequest(version="v1"), cri.VersionResponse)

    async def list_pods(self) -> list[cri.PodSandbox]:
        resp = await self._call("ListPodSandbox", cri.ListPodSandboxRequest(), cri.ListPodSandboxResponse)
        return list(resp.items)

    async def pod_status(self, pod_id: str) -> cri.PodSandboxStatusResponse:
        return await self._call("PodSandboxStatus", cri.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True),
                                cri.PodSandboxStatusResponse)

    async def list_containers(self, pod_id: str = "") -> list[cri.Container]:
        req = cri.ListContainersRequest()
        if pod_id:
            req.filter.pod_sandbox_id = pod_id
        resp = await self._call("ListContainers", req, cri.ListContainersResponse)
        return list(resp.containers)

    async def container_status(self, container_id: str, verbose: bool = True) -> cri.ContainerStatusResponse:
        return await self._call("ContainerStatus",
                                cri.ContainerStatusRequest(container_id=container_id, verbose=verbose),
                                cri.ContainerStatusResponse)

    async def update_resources(self, container_id: str, res: cri.LinuxContainerResources) -> None:
        """Push res as the container's resources."""
        await self._call("UpdateContainerResources",
                         cri.UpdateContainerResourcesRequest(container_id=container_id, linux=res),
                         cri.UpdateContainerResourcesResponse)

    def container_events(self) -> grpc.aio.UnaryStreamCall:
        """The runtime's GetContainerEvents stream (no deadline: it lasts as long as we follow it)."""
        call = self.channel.unary_stream(_SERVICE + "GetContainerEvents",
                                         request_serializer=cri.GetEventsRequest.SerializeToString,
                                         response_deserializer=_lenient_event)
        return call(cri.GetEventsRequest())


def _lenient_event(raw: bytes) -> cri.ContainerEventResponse:
    return protowire.parse(cri.ContainerEventResponse, raw)[0]


class CriRuntime:
    """The engine's Runtime (resmgr.engine.state) over a CRI client: answers in model terms."""

    def __init__(self, client: RuntimeClient) -> None:
        self.client = client

    async def list_pods(self) -> list[Pod]:
        return [convert.listed_pod(p) for p in await self.client.list_pods()]

    async def pod_details(self, pod: Pod) -> Pod:
        st = await self.client.pod_status(pod.id)
        linux = convert.dig(convert.verbose_info(st.info), "config", "linux")
        parent = str(convert.dig(linux, "cgroup_parent") or "")
        pod.cgroup_parent, pod.qos_class = parent, qos_class_from_cgroup_parent(parent)
        pod.overhead = convert.json_resources(convert.dig(linux, "overhead"))
        pod.resources = convert.json_resources(convert.dig(linux, "resources"))
        return pod

    async def list_containers(self, pod_id: str = "") -> list[Container]:
        return [convert.listed_container(c) for c in await self.client.list_containers(pod_id)]

    async def container_details(self, c: Container) -> tuple[Container, list[str]]:
        st = await self.client.container_status(c.id)
        res = convert.status_resources(st)
        config = convert.dig(convert.verbose_info(st.info), "config")
        config = config if isinstance(config, dict) else {}
        devices = [str(d.get("host_path") or "") for d in config.get("devices") or [] if isinstance(d, dict)]
        c.command, c.args = ([str(x) for x in v] if isinstance(v, list) else []
                             for v in (config.get("command"), config.get("args")))
        c.requested, c.resources = res, Resources.from_dict(res.to_dict())
        c.env = {str(e.get("key") or ""): str(e.get("value") or "") for e in config.get("envs") or []
                 if isinstance(e, dict) and e.get("key")}
        # The claims it uses, as CreateContainer named them: a container adopted with the state lost
        # runs on its claim's CPUs, not on the shared ones beside them.
        c.claims = cdi.claim_uids(str(d.get("name") or "") for d in config.get("CDI_devices") or []
                                  if isinstance(d, dict))
        return c, devices

    async def running_resources(self, container_id: str) -> tuple[str, str] | None:
        st = await self.client.container_status(container_id, verbose=False)
        if not st.status.resources.HasField("linux"):
            return None
        linux = st.status.resources.linux
        return linux.cpuset_cpus, linux.cpuset_mems

    def delivering(self, container_id: str) -> bool:
        return False  # an update returns once the runtime has taken it

    def failed_update(self, container_id: str) -> Resources | None:
        return None  # a failed update raises to the pusher, which keeps it pending

    async def update_resources(self, container_id: str, res: Resources) -> None:
        try:
            await self.client.update_resources(container_id, convert.to_linux(res))
        except Exception as err:
            # containerd's words while its record still says running (a stop under way whose exit
            # it has not handled yet: minutes on a starved node).
            details = getattr(err, "details", None)
            if callable(details) and STOPPED in (details() or ""):
                raise Stopped(details()) from err
            raise
