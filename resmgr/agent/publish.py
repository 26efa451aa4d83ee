"""Publishing what cri-resmgr reports of this node: its NodeResourceTopology and, when it is a DRA
driver, its ResourceSlice.

cri-resmgr streams each over the config link (WatchTopology, WatchDevices): once at once, then
whenever containers or claims come and go, at most once per interval. Only the latest document is
written; a burst of changes while a write is under way becomes one write. Each object is named
after the node and owned by its Node object, so it goes with it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from resmgr.agent import resources
from resmgr.agent.kube import Backoff, Cluster
from resmgr.generated.config import status_pb2, status_pb2_grpc

log = logging.getLogger("cri-resmgr-agent.publish")


class Publisher:
    """Follows one of cri-resmgr's streams and writes the latest object it makes of it."""

    what = ""  # the kind written, for messages

    def __init__(self, cluster: Cluster, socket: str, interval: float, node: Callable[[], dict[str, Any] | None],
                 backoff: Callable[[], Backoff]) -> None:
        self.cluster, self.socket, self.interval = cluster, socket, interval
        self.node = node  # the Node object as last watched, for the owner reference
        self.backoff = backoff
        self.latest: dict[str, Any] | None = None
        self.written: dict[str, Any] | None = None
        self.error = ""  # why the object is not current, "" when it is
        self._new = asyncio.Event()

    def stream(self, stub: status_pb2_grpc.StatusStub) -> AsyncIterator[Any]:
        raise NotImplementedError

    def document(self, reply: Any) -> dict[str, Any]:
        raise NotImplementedError

    def body(self, doc: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def put(self, body: dict[str, Any]) -> None:
        raise NotImplementedError

    def metadata(self, name: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/managed-by": "cri-resmgr-agent"}}
        if owners := self.cluster.owner(self.node()):
            meta["ownerReferences"] = owners
        return meta

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._follow())
            tg.create_task(self._write())

    async def _follow(self) -> None:
        backoff = self.backoff()
        async with grpc.aio.insecure_channel("unix://" + self.socket) as channel:
            stub = status_pb2_grpc.StatusStub(channel)
            while True:
                # Written again after a new stream begins: while cri-resmgr was away the object may have
                # gone (kubelet deletes a DRA driver's slices once the driver is gone a while).
                self.written = None
                try:
                    async for reply in self.stream(stub):
                        self.latest = self.document(reply)
                        self._new.set()
                        backoff.reset()
                    raise ConnectionError("cri-resmgr ended the stream")
                except (grpc.aio.AioRpcError, ConnectionError, ValueError) as err:
                    why = f"{err.code().name}: {err.details()}" if isinstance(err, grpc.aio.AioRpcError) else str(err)
                    delay = backoff.next()
                    log.warning("following cri-resmgr's %s failed (%s); retrying in %.1fs", self.what, why, delay)
                    await asyncio.sleep(delay)

    async def _write(self) -> None:
        backoff = self.backoff()
        while True:
            await self._new.wait()
            self._new.clear()
            if self.latest is None:
                continue
            body = self.body(self.latest)  # the owner may have become known since the last write
            if body == self.written:
                continue
            try:
                await self.put(body)
            except Exception as err:  # the API server is away or refuses: try again later
                self.error = f"writing {self.what} {self.cluster.node_name}: {err}"
                delay = backoff.next()
                log.warning("%s; retrying in %.1fs", self.error, delay)
                await asyncio.sleep(delay)
                self._new.set()
                continue
            self.written, self.error = body, ""
            backoff.reset()
            await asyncio.sleep(self.interval)  # the API server's share of the rate limit


class TopologyExporter(Publisher):
    what = resources.NRT_KIND

    def stream(self, stub: status_pb2_grpc.StatusStub) -> AsyncIterator[Any]:
        return stub.WatchTopology(status_pb2.WatchTopologyRequest(min_interval=self.interval))

    def document(self, reply: Any) -> dict[str, Any]:
        return json.loads(reply.topology)

    def body(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": f"{resources.NRT_GROUP}/{resources.NRT_VERSION}", "kind": resources.NRT_KIND,
                "metadata": self.metadata(self.cluster.node_name), **doc}

    async def put(self, body: dict[str, Any]) -> None:
        await self.cluster.put_topology(body)


def _attribute(value: int | str | bool) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"bool": value}
    return {"int": value} if isinstance(value, int) else {"string": str(value)}


NUMA_NODE = "resource.kubernetes.io/numaNode"  # Kubernetes' standard attribute (KEP-6072)


@dataclass(frozen=True)
class SliceShape:
    """What the cluster's feature gates let a slice say beyond the stable API."""

    node_allocatable: bool = False  # KEP-5517: claimed CPUs count against the node's allocatable cpu
    numa_list: bool = False  # DRAListTypeAttributes: the standard numaNode attribute as a list


def device(d: dict[str, Any], shape: SliceShape = SliceShape()) -> dict[str, Any]:
    """A device of a ResourceSlice (resource.k8s.io/v1) from one cri-resmgr offers: its free CPUs
    are capacity that many claims share; a request that names no amount takes all of it (which a
    request policy would replace by its default, so there is none). The standard numaNode
    attribute of a device spanning NUMA nodes (a list) is sent only to clusters taking lists."""
    attributes = {k: _attribute(v) for k, v in sorted(d["attributes"].items()) if not isinstance(v, list)}
    numa = d["attributes"].get(NUMA_NODE)
    if shape.numa_list and numa is not None:
        attributes[NUMA_NODE] = {"ints": numa if isinstance(numa, list) else [numa]}
    out = {"name": d["name"], "attributes": attributes, "capacity": {"cpu": {"value": str(d["cpus"])}},
           "allowMultipleAllocations": True}
    if shape.node_allocatable:
        out["nodeAllocatableResources"] = {"cpu": {"mapping": {"capacityKey": "cpu", "capacityMultiplier": "1"}}}
    if d.get("consumes"):
        out["consumesCounters"] = [{"counterSet": cset, "counters": _counters(c)}
                                   for cset, c in sorted(d["consumes"].items())]
    return out


def shared_counters(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The counter sets the devices consume from (KEP-4815), each counter as big as its biggest
    consumer: the CPUs of the part of the node the devices overlap on."""
    sets: dict[str, dict[str, int]] = {}
    for d in devices:
        for cset, counters in (d.get("consumes") or {}).items():
            for name, value in counters.items():
                sets.setdefault(cset, {})[name] = max(sets.get(cset, {}).get(name, 0), value)
    return [{"name": cset, "counters": _counters(c)} for cset, c in sorted(sets.items())]


def _counters(counters: dict[str, int]) -> dict[str, Any]:
    return {k: {"value": str(v)} for k, v in sorted(counters.items())}


# Devices a slice may hold (resource.k8s.io/v1), and with counters or list attributes.
MAX_DEVICES, MAX_DEVICES_ADVANCED = 128, 64


def _pages(devices: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    """The devices split into slices of at most `size` (one slice, maybe empty, at least)."""
    return [devices[i:i + size] for i in range(0, len(devices), size)] or [[]]


def slice_name(node: str, driver: str) -> str:
    """The node's slice of the driver: a DNS subdomain of both names."""
    return re.sub(r"[^a-z0-9.-]", "-", f"{node}-{driver}".lower())[:253].strip("-.")


def counters_name(node: str, driver: str) -> str:
    """The node's slice of the counters its devices share."""
    return slice_name(node, driver)[:244].strip("-.") + "-counters"


class SliceExporter(Publisher):
    """This node's ResourceSlice: one pool named after the node, the devices cri-resmgr offers. The
    pool's generation grows with every write, so the scheduler takes the newest. Where devices
    overlap (a NUMA node and its L3 domains) the counters they share are a second slice of the pool
    (a slice holds devices or counters, not both), written first. Devices beyond what one slice
    holds (128, or 64 with counters or list attributes: one per CPU of a big node) go on in
    `<name>-2`, `<name>-3`, ... A slice no longer needed is left to the scheduler to ignore (a
    pool's older generation) and to kubelet and the Node to collect: the agent may not delete
    slices, which would let it delete other drivers'."""

    what = resources.SLICE_KIND

    def __init__(self, *args: Any, shape: SliceShape = SliceShape()) -> None:
        super().__init__(*args)
        self.shape = shape
        self.generation = 0

    def stream(self, stub: status_pb2_grpc.StatusStub) -> AsyncIterator[Any]:
        return stub.WatchDevices(status_pb2.WatchDevicesRequest(min_interval=self.interval))

    def document(self, reply: Any) -> dict[str, Any]:
        return {"driver": reply.driver, "devices": json.loads(reply.devices)}

    def body(self, doc: dict[str, Any]) -> dict[str, Any]:
        node, driver = self.cluster.node_name, doc["driver"]
        counters = shared_counters(doc["devices"])
        devices = [device(d, self.shape) for d in doc["devices"]]
        pages = _pages(devices, MAX_DEVICES_ADVANCED if counters or self.shape.numa_list else MAX_DEVICES)
        pool = {"name": node, "generation": 0, "resourceSliceCount": len(pages) + bool(counters)}

        def one(name: str, **spec: Any) -> dict[str, Any]:
            return {"apiVersion": f"{resources.DRA_GROUP}/{resources.DRA_VERSION}", "kind": resources.SLICE_KIND,
                    "metadata": self.metadata(name), "spec": {"driver": driver, "nodeName": node, "pool": pool, **spec}}
        base = slice_name(node, driver)
        slices = [one(base if i == 0 else f"{base[:245].strip('-.')}-{i + 1}", devices=page)
                  for i, page in enumerate(pages)]
        if not counters:
            return {"slices": slices}
        return {"slices": [one(counters_name(node, driver), sharedCounters=counters), *slices]}

    async def put(self, body: dict[str, Any]) -> None:
        # Milliseconds since the epoch, and above the last: newer than any slice an agent wrote before.
        self.generation = max(time.time_ns() // 1_000_000, self.generation + 1)
        for one in json.loads(json.dumps(body["slices"])):
            one["spec"]["pool"]["generation"] = self.generation
            await self.cluster.put_slice(one)
