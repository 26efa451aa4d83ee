"""The config link: the gRPC Config service the node agent pushes to, and Status (the configuration in
force, and the topology stream of resmgr/view/feed.py).

Served on a root-only unix socket: the agent runs as root, nobody else may reconfigure. Served by
grpclib (pure Python, on h2) rather than gRPC's C core: a few calls a minute do not need it, and
the NRI plugin then loads no gRPC at all (about 10 MB less at rest).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from resmgr import sockets
from resmgr.control.manager import ConfigManager, Rejected
from resmgr.generated.config import api_pb2, status_pb2
from resmgr.view.feed import StateFeed

log = logging.getLogger("cri-resmgr.config")

CONFIG = "/v1.Config/"
STATUS = "/crirm.v1.Status/"
Call = Callable[[Stream[Any, Any]], Awaitable[None]]


@dataclass
class Devices:
    """The DRA driver's name and the feed of the devices its policy offers (a JSON list)."""

    driver: str
    feed: StateFeed


class Calls:
    """The calls in flight, so that a shutdown lets unary ones finish and ends the streams (as
    finished, not failed: a client just follows them again) before it closes the link."""

    def __init__(self) -> None:
        self.closing = False
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._streams: set[asyncio.Task[None]] = set()

    def wrap(self, handler: Call) -> Call:
        async def call(stream: Stream[Any, Any]) -> None:
            if self.closing:
                raise GRPCError(Status.UNAVAILABLE, "cri-resmgr is shutting down")
            self._running += 1
            self._idle.clear()
            try:
                await handler(stream)
            finally:
                self._running -= 1
                if not self._running:
                    self._idle.set()
        return call

    async def follow(self, stream: Stream[Any, Any], replies: AsyncIterator[Any]) -> None:
        """Send each reply until the client goes or the link closes."""
        task = asyncio.ensure_future(_send_all(stream, replies))
        self._streams.add(task)
        try:
            await task
        except asyncio.CancelledError:
            if not self.closing:
                raise
        finally:
            self._streams.discard(task)

    async def drained(self, grace: float) -> None:
        self.closing = True
        try:
            async with asyncio.timeout(grace):
                await self._idle.wait()
        except TimeoutError:
            log.warning("config link: %d call(s) still running after %.1fs; ended", self._running, grace)
        for task in self._streams:
            task.cancel()
        await asyncio.sleep(0)  # let the streams end before the server goes


async def _request(stream: Stream[Any, Any]) -> Any:
    request = await stream.recv_message()
    if request is None:  # the client ended its side without a message
        raise GRPCError(Status.INVALID_ARGUMENT, "no request message")
    return request


async def _send_all(stream: Stream[Any, Any], replies: AsyncIterator[Any]) -> None:
    async for reply in replies:
        await stream.send_message(reply)


class ConfigService:
    def __init__(self, control: ConfigManager, calls: Calls) -> None:
        self.control = control
        self.calls = calls

    def __mapping__(self) -> Mapping[str, Handler]:
        return {
            CONFIG + "SetConfig": Handler(self.calls.wrap(self.set_config), Cardinality.UNARY_UNARY,
                                          api_pb2.SetConfigRequest, api_pb2.SetConfigReply),
            CONFIG + "SetAdjustment": Handler(self.set_adjustment, Cardinality.UNARY_UNARY,
                                              api_pb2.SetAdjustmentRequest, api_pb2.SetAdjustmentReply),
        }

    async def set_config(self, stream: Stream[api_pb2.SetConfigRequest, api_pb2.SetConfigReply]) -> None:
        request = await _request(stream)
        log.info("configuration pushed for node %s (%d keys)", request.node_name, len(request.config))
        try:
            # Applied whole even if the caller gives up meanwhile (its deadline, a shutdown): a
            # configuration half applied is worse than one answered late.
            await asyncio.shield(self.control.push(request.node_name, dict(request.config)))
        except Rejected as err:
            await stream.send_message(api_pb2.SetConfigReply(error=str(err)))
            return
        await stream.send_message(api_pb2.SetConfigReply())

    async def set_adjustment(self, stream: Stream[Any, Any]) -> None:
        raise GRPCError(Status.UNIMPLEMENTED, "external adjustments are not supported")


class StatusService:
    def __init__(self, control: ConfigManager, calls: Calls, feed: StateFeed | None = None,
                 devices: Devices | None = None, serving: Callable[[], str] | None = None) -> None:
        self.control = control
        self.calls = calls
        self.feed = feed
        self.devices = devices
        self.serving = serving

    def __mapping__(self) -> Mapping[str, Handler]:
        return {
            STATUS + "GetStatus": Handler(self.calls.wrap(self.get_status), Cardinality.UNARY_UNARY,
                                          status_pb2.GetStatusRequest, status_pb2.GetStatusReply),
            STATUS + "WatchTopology": Handler(self.watch_topology, Cardinality.UNARY_STREAM,
                                              status_pb2.WatchTopologyRequest, status_pb2.TopologyReply),
            STATUS + "WatchDevices": Handler(self.watch_devices, Cardinality.UNARY_STREAM,
                                             status_pb2.WatchDevicesRequest, status_pb2.DevicesReply),
        }

    async def get_status(self, stream: Stream[Any, status_pb2.GetStatusReply]) -> None:
        await stream.recv_message()
        await stream.send_message(status_pb2.GetStatusReply(
            **self.control.status(), not_serving=self.serving() if self.serving is not None else ""))

    async def watch_topology(self, stream: Stream[status_pb2.WatchTopologyRequest, status_pb2.TopologyReply]) -> None:
        request = await _request(stream)
        if self.feed is None:
            raise GRPCError(Status.UNAVAILABLE, "this daemon knows no topology")
        await self.calls.follow(stream, (status_pb2.TopologyReply(topology=text)
                                            async for text in self.feed.texts(request.min_interval)))

    async def watch_devices(self, stream: Stream[status_pb2.WatchDevicesRequest, status_pb2.DevicesReply]) -> None:
        request = await _request(stream)
        if self.devices is None:
            raise GRPCError(Status.FAILED_PRECONDITION, "this cri-resmgr is no DRA driver (--dra-driver)")
        driver = self.devices.driver
        await self.calls.follow(stream, (status_pb2.DevicesReply(driver=driver, devices=text)
                                            async for text in self.devices.feed.texts(request.min_interval)))


class Link:
    """The served link: stop() lets unary calls in flight finish, then ends every stream."""

    def __init__(self, server: Server, calls: Calls) -> None:
        self.server, self.calls = server, calls

    async def stop(self, grace: float) -> None:
        await self.calls.drained(grace)
        self.server.close()
        try:
            async with asyncio.timeout(grace):
                await self.server.wait_closed()
        except TimeoutError:
            log.warning("config link: not closed within %.1fs", grace)


async def serve(control: ConfigManager, path: str, feed: StateFeed | None = None,
                group: int = -1, devices: Devices | None = None,
                serving: Callable[[], str] | None = None) -> Link:
    """The link on a root-only socket; group (>= 0): its members may connect too; serving():
    why the daemon takes no runtime calls now ("": it does)."""
    calls = Calls()
    server = Server([ConfigService(control, calls), StatusService(control, calls, feed, devices, serving)])
    with sockets.private(path):
        await server.start(path=path)
    if group >= 0:
        sockets.grant_group(path, group)
    log.info("config link serving on %s", path)
    return Link(server, calls)
