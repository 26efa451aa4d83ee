"""Publishing this node's NodeResourceTopology, as cri-resmgr reports it.

cri-resmgr streams its resource topology over the config link (WatchTopology): once at
once, then whenever containers come and go, at most once per interval. Only the latest
document is written; a burst of changes while a write is under way becomes one write.
The object is named after the node and owned by its Node object, so it goes with it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import grpc

from resmgr.agent import resources
from resmgr.agent.kube import Backoff, Cluster
from resmgr.generated.config import status_pb2, status_pb2_grpc

log = logging.getLogger("cri-resmgr-agent.topology")


class TopologyExporter:
    def __init__(self, cluster: Cluster, socket: str, interval: float, node: Callable[[], dict[str, Any] | None],
                 backoff: Callable[[], Backoff]) -> None:
        self.cluster, self.socket, self.interval = cluster, socket, interval
        self.node = node  # the Node object as last watched, for the owner reference
        self.backoff = backoff
        self.latest: dict[str, Any] | None = None
        self.written: dict[str, Any] | None = None
        self.error = ""  # why the topology is not current, "" when it is
        self._new = asyncio.Event()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._follow())
            tg.create_task(self._write())

    async def _follow(self) -> None:
        backoff = self.backoff()
        async with grpc.aio.insecure_channel("unix://" + self.socket) as channel:
            stub = status_pb2_grpc.StatusStub(channel)
            while True:
                try:
                    async for reply in stub.WatchTopology(status_pb2.WatchTopologyRequest(min_interval=self.interval)):
                        self.latest = json.loads(reply.topology)
                        self._new.set()
                        backoff.reset()
                    raise ConnectionError("cri-resmgr ended the topology stream")
                except (grpc.aio.AioRpcError, ConnectionError, ValueError) as err:
                    why = f"{err.code().name}: {err.details()}" if isinstance(err, grpc.aio.AioRpcError) else str(err)
                    delay = backoff.next()
                    log.warning("following cri-resmgr's topology failed (%s); retrying in %.1fs", why, delay)
                    await asyncio.sleep(delay)

    def body(self, doc: dict[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.cluster.node_name,
                                "labels": {"app.kubernetes.io/managed-by": "cri-resmgr-agent"}}
        if owners := self.cluster.owner(self.node()):
            meta["ownerReferences"] = owners
        return {"apiVersion": f"{resources.NRT_GROUP}/{resources.NRT_VERSION}", "kind": resources.NRT_KIND,
                "metadata": meta, **doc}

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
                await self.cluster.put_topology(body)
            except Exception as err:  # the API server is away or refuses: try again later
                self.error = f"writing {resources.NRT_KIND} {self.cluster.node_name}: {err}"
                delay = backoff.next()
                log.warning("%s; retrying in %.1fs", self.error, delay)
                await asyncio.sleep(delay)
                self._new.set()
                continue
            self.written, self.error = body, ""
            backoff.reset()
            await asyncio.sleep(self.interval)  # the API server's share of the rate limit
