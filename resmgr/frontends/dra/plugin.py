"""The DRA driver kubelet talks to: plugin registration (kubelet finds the socket in its
plugins_registry directory and asks what it is) and the DRA node service v1 (prepare and
unprepare ResourceClaims), both gRPC on root-only unix sockets.

Prepare reads each claim through the node agent (the only process that talks to the API server),
has the engine hold its CPUs (on disk before the answer), writes the claim's CDI spec, and answers
with its CDI device, which kubelet hands to the runtime with every container using the claim: the
relay and NRI front ends read the claim from it (resmgr/cdi.py). Unprepare gives the CPUs back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from resmgr import cdi, sockets
from resmgr.engine import Engine
from resmgr.engine.state import NotReady
from resmgr.frontends.dra.allocation import ClaimError, ClaimGone, claim
from resmgr.generated.agent import claims_pb2, claims_pb2_grpc
from resmgr.generated.dra import api_pb2 as dra
from resmgr.generated.dra import api_pb2_grpc as dra_grpc
from resmgr.generated.dra import health_pb2 as health
from resmgr.generated.dra import health_pb2_grpc as health_grpc
from resmgr.generated.pluginregistration import api_pb2 as reg
from resmgr.generated.pluginregistration import api_pb2_grpc as reg_grpc
from resmgr.model import Claim
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.sysfs import TopologyError, online_cpus

log = logging.getLogger("cri-resmgr.dra")

SERVICE = "v1.DRAPlugin"  # the DRA service version kubelet is told this driver serves
HEALTH_SERVICE = "v1.DRAResourceHealth"  # and the optional device health stream
HEALTH_INTERVAL = 10.0  # seconds between two health reports (kubelet takes 3 missed ones as unknown)
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
FETCH_TIMEOUT = 10.0
COLLECT_INTERVAL = 300.0  # seconds between two looks for claims nobody will unprepare

Fetch = Callable[[str, str], Awaitable[dict[str, Any]]]


def check_driver_name(name: str) -> None:
    """ValueError unless name can be a DRA driver's name (a DNS subdomain of at most 63 characters)."""
    if len(name) > 63 or not _DNS_SUBDOMAIN.match(name):
        raise ValueError(f"{name!r} is not a DNS subdomain of at most 63 characters, e.g. "
                         "cpu.cri-resource-manager.intel.com")


class AgentClaims:
    """ResourceClaims read through the node agent's Claims service, over one channel (it reconnects
    by itself when the agent restarts)."""

    def __init__(self, agent_socket: str) -> None:
        self.socket = agent_socket
        self._channel: grpc.aio.Channel | None = None

    async def __call__(self, namespace: str, name: str) -> dict[str, Any]:
        if self._channel is None:  # made on the daemon's loop, at the first claim
            self._channel = grpc.aio.insecure_channel("unix://" + self.socket)
        try:
            reply = await claims_pb2_grpc.ClaimsStub(self._channel).GetResourceClaim(
                claims_pb2.GetResourceClaimRequest(namespace=namespace, name=name), timeout=FETCH_TIMEOUT)
        except grpc.aio.AioRpcError as err:
            kind = ClaimGone if err.code() == grpc.StatusCode.NOT_FOUND else ClaimError
            raise kind(f"claim {namespace}/{name}: the node agent on {self.socket} could not read it "
                       f"({err.code().name}: {err.details()})") from None
        return json.loads(reply.claim)

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver, self.endpoint = driver, endpoint
        self.registered = asyncio.Event()

    async def GetInfo(self, request: reg.InfoRequest,  # noqa: N802 - gRPC method names
                      context: grpc.aio.ServicerContext) -> reg.PluginInfo:
        return reg.PluginInfo(type="DRAPlugin", name=self.driver, endpoint=self.endpoint,
                              supported_versions=[SERVICE, HEALTH_SERVICE])

    async def NotifyRegistrationStatus(self, request: reg.RegistrationStatus,  # noqa: N802
                                       context: grpc.aio.ServicerContext) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("kubelet registered DRA driver %s", self.driver)
            self.registered.set()
        else:
            log.error("kubelet refused DRA driver %s: %s", self.driver, request.error)
        return reg.RegistrationStatusResponse()


class NodeService(dra_grpc.DRAPluginServicer):
    def __init__(self, driver: str, engine: Engine, fetch: Fetch, cdi_dir: str) -> None:
        self.driver, self.engine, self.fetch, self.cdi_dir = driver, engine, fetch, Path(cdi_dir)

    async def NodePrepareResources(self, request: dra.NodePrepareResourcesRequest,  # noqa: N802
                                   context: grpc.aio.ServicerContext) -> dra.NodePrepareResourcesResponse:
        answers: dict[str, dra.NodePrepareResourceResponse] = {}
        wanted: list[Claim] = []
        # A pod's claims read at once over the one channel: kubelet's deadline is for them all.
        fetched = await asyncio.gather(*(self.fetch(a.namespace, a.name) for a in request.claims),
                                       return_exceptions=True)
        for asked, doc in zip(request.claims, fetched, strict=True):
            try:
                if isinstance(doc, BaseException):
                    raise doc
                wanted.append(claim(doc, self.driver, asked.uid))
            except (ClaimError, ValueError) as err:
                answers[asked.uid] = dra.NodePrepareResourceResponse(error=str(err))
        try:
            errors = await self.engine.claiming.prepare_claims(wanted)
        except NotReady as err:
            errors = {c.uid: str(err) for c in wanted}
        for c in wanted:
            if c.uid in errors:
                log.warning("%s not prepared: %s", c.who, errors[c.uid])
                answers[c.uid] = dra.NodePrepareResourceResponse(error=errors[c.uid])
                continue
            held = self.engine.claiming.claim_held(c.uid) or {}
            await asyncio.to_thread(write_spec, self.cdi_dir, c, str(held.get("cpus", "")))
            answers[c.uid] = dra.NodePrepareResourceResponse(devices=[dra.Device(
                request_names=c.requests, pool_name=c.pool, device_name=c.device,
                cdi_device_ids=[cdi.device_id(c.uid)])])
        return dra.NodePrepareResourcesResponse(claims=answers)

    async def NodeUnprepareResources(self, request: dra.NodeUnprepareResourcesRequest,  # noqa: N802
                                     context: grpc.aio.ServicerContext) -> dra.NodeUnprepareResourcesResponse:
        uids = [c.uid for c in request.claims]
        try:
            await self.engine.claiming.unprepare_claims(uids)
        except NotReady as err:
            return dra.NodeUnprepareResourcesResponse(
                claims={u: dra.NodeUnprepareResourceResponse(error=str(err)) for u in uids})
        for uid in uids:
            await asyncio.to_thread(remove_spec, self.cdi_dir, uid)
        return dra.NodeUnprepareResourcesResponse(claims={u: dra.NodeUnprepareResourceResponse() for u in uids})


class Health(health_grpc.DRAResourceHealthServicer):
    """The devices of the claims prepared here, each unhealthy while CPUs it had when the daemon
    started are offline (the kernel's online CPUs read anew for every report). A device is named
    in the pool of its claims: the pool kubelet knows it by."""

    def __init__(self, engine: Engine, online: Callable[[], CPUSet], interval: float = HEALTH_INTERVAL) -> None:
        self.engine, self.online, self.interval = engine, online, interval

    def _online(self) -> CPUSet | str:
        """The CPUs online now, or why they cannot be read (off the event loop: a file read)."""
        try:
            return self.online()
        except (OSError, TopologyError) as err:
            return f"the online CPUs cannot be read: {err}"

    def report(self, online: CPUSet | str) -> health.NodeWatchResourcesResponse:
        cpus = {d["name"]: CPUSet.parse(d.get("cpuset", "")) for d in self.engine.claiming.devices()}
        now = int(time.time())
        out = []
        for pool, name in sorted({(c.pool, c.device) for c, _ in self.engine.claiming.prepared_claims() if c.pool}):
            state, message = _health(name, cpus.get(name), online)
            out.append(health.DeviceHealth(device=health.DeviceIdentifier(pool_name=pool, device_name=name),
                                           health=state, last_updated_time=now, message=message,
                                           health_check_timeout_seconds=max(int(3 * self.interval), 1)))
        return health.NodeWatchResourcesResponse(devices=out)

    async def NodeWatchResources(self, request: health.NodeWatchResourcesRequest,  # noqa: N802
                                 context: grpc.aio.ServicerContext) -> AsyncIterator[health.NodeWatchResourcesResponse]:
        while True:
            yield self.report(await asyncio.to_thread(self._online))
            await asyncio.sleep(self.interval)


def _health(name: str, cpus: CPUSet | None, online: CPUSet | str) -> tuple[int, str]:
    """A device's health and why, from its CPUs (None: not offered now) and the CPUs online."""
    if isinstance(online, str):
        return health.UNKNOWN, online
    if cpus is None:
        return health.UNHEALTHY, f"the policy in force offers no device {name}"
    if gone := cpus - online:
        return health.UNHEALTHY, f"CPUs {gone} of device {name} are offline"
    return health.HEALTHY, ""


def write_spec(directory: Path, c: Claim, cpus: str) -> None:
    """The claim's CDI spec, written whole or not at all."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / cdi.spec_file(c.uid)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cdi.spec(c.uid, cpus, c.to_dict())))
    os.replace(tmp, path)


def claims_on_disk(directory: str | Path) -> list[Claim]:
    """The claims our CDI specs in directory record (specs that record none, or cannot be read, left out)."""
    out = []
    path = Path(directory)
    for spec_path in sorted(path.iterdir()) if path.is_dir() else []:
        uid = cdi.spec_uid(spec_path.name)
        try:
            doc = cdi.spec_claim(json.loads(spec_path.read_text())) if uid is not None else None
            if doc is not None and doc.get("uid") == uid:
                out.append(Claim.from_dict(doc))
        except (OSError, ValueError, TypeError) as err:
            log.warning("CDI spec %s: not read (%s)", spec_path, err)
    return out


def remove_spec(directory: Path, uid: str) -> None:
    (directory / cdi.spec_file(uid)).unlink(missing_ok=True)


class DraPlugin:
    """Both services, and the CDI specs kept to the claims the engine holds."""

    def __init__(self, driver: str, kubelet_dir: str, cdi_dir: str, engine: Engine, fetch: Fetch,
                 online: Callable[[], CPUSet] | None = None, health_interval: float = HEALTH_INTERVAL) -> None:
        """online: the CPUs online now (default: this machine's, from sysfs)."""
        check_driver_name(driver)
        self.driver, self.engine, self.cdi_dir = driver, engine, Path(cdi_dir)
        self.registry_socket = os.path.join(kubelet_dir, "plugins_registry", f"{driver}-reg.sock")
        self.endpoint = os.path.join(kubelet_dir, "plugins", driver, "dra.sock")
        self.registration = Registration(driver, self.endpoint)
        self.node = NodeService(driver, engine, fetch, cdi_dir)
        self.health = Health(engine, online or (lambda: online_cpus("/")), health_interval)
        self._servers: list[grpc.aio.Server] = []

    async def start(self) -> None:
        """The specs of the claims held made current, then the node service, then registration (so
        kubelet never finds a driver it cannot call)."""
        await asyncio.to_thread(self._sync_specs)
        node = grpc.aio.server()
        dra_grpc.add_DRAPluginServicer_to_server(self.node, node)
        health_grpc.add_DRAResourceHealthServicer_to_server(self.health, node)
        await sockets.start_private(node, self.endpoint)
        self._servers.append(node)
        registry = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(self.registration, registry)
        await sockets.start_private(registry, self.registry_socket)
        self._servers.append(registry)
        log.info("DRA driver %s: registration on %s, service on %s", self.driver, self.registry_socket,
                 self.endpoint)

    async def collect(self, interval: float = COLLECT_INTERVAL) -> None:
        """Unprepare the claims kubelet will never unprepare (it lost its record of them, or the node
        was down when their pods went): those no container uses, gone from the API server or no
        longer allocated here. A claim that cannot be read now is kept."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.collect_once()
            except Exception as err:  # a failed look must not end the daemon: the next one tries again
                log.warning("looking for claims nobody will unprepare failed: %s", err)

    async def collect_once(self) -> list[str]:
        """One look; the UIDs unprepared."""
        gone = []
        for c, held in self.engine.claiming.prepared_claims():
            if held is not None and held.get("users"):
                continue
            try:
                claim(await self.node.fetch(c.namespace, c.name), self.driver, c.uid)
            except ClaimGone as err:
                log.warning("%s: unprepared, as nothing will use it (%s)", c.who, err)
                gone.append(c.uid)
            except (ClaimError, ValueError):
                continue
        if gone:
            await self.engine.claiming.unprepare_claims(gone)
            for uid in gone:
                await asyncio.to_thread(remove_spec, self.cdi_dir, uid)
        return gone

    def _sync_specs(self) -> None:
        prepared = self.engine.claiming.prepared_claims()
        held = {c.uid for c, _ in prepared}
        for c, doc in prepared:
            if doc is not None:
                write_spec(self.cdi_dir, c, str(doc.get("cpus", "")))
        if self.cdi_dir.is_dir():
            for path in self.cdi_dir.iterdir():
                uid = cdi.spec_uid(path.name)
                if uid is not None and uid not in held:
                    path.unlink(missing_ok=True)

    async def stop(self) -> None:
        """Registration first: kubelet stops calling a driver whose socket is gone."""
        for server in reversed(self._servers):
            await server.stop(1.0)
        for path in (self.registry_socket, self.endpoint):
            Path(path).unlink(missing_ok=True)
        self._servers.clear()
