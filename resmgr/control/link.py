"""The config link: the gRPC Config service the node agent pushes to, and Status (the configuration in
force, and the topology stream of resmgr/view/feed.py).

Served on a root-only unix socket: the agent runs as root, nobody else may reconfigure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from resmgr import sockets
from resmgr.control.manager import ConfigManager, Rejected
from resmgr.generated.config import api_pb2, api_pb2_grpc, status_pb2, status_pb2_grpc
from resmgr.view.feed import StateFeed

log = logging.getLogger("cri-resmgr.config")


class ConfigService(api_pb2_grpc.ConfigServicer):
    def __init__(self, control: ConfigManager) -> None:
        self.control = control

    async def SetConfig(self, request: api_pb2.SetConfigRequest,  # noqa: N802 - gRPC method name
                        context: grpc.aio.ServicerContext) -> api_pb2.SetConfigReply:
        log.info("configuration pushed for node %s (%d keys)", request.node_name, len(request.config))
        try:
            await self.control.push(request.node_name, dict(request.config))
        except Rejected as err:
            return api_pb2.SetConfigReply(error=str(err))
        return api_pb2.SetConfigReply()

    async def SetAdjustment(self, request: api_pb2.SetAdjustmentRequest,  # noqa: N802
                            context: grpc.aio.ServicerContext) -> api_pb2.SetAdjustmentReply:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "external adjustments are not supported")
        raise AssertionError("unreachable")


@dataclass
class Devices:
    """The DRA driver's name and the feed of the devices its policy offers (a JSON list)."""

    driver: str
    feed: StateFeed


class StatusService(status_pb2_grpc.StatusServicer):
    def __init__(self, control: ConfigManager, feed: StateFeed | None = None,
                 devices: Devices | None = None, serving: Callable[[], str] | None = None) -> None:
        self.control = control
        self.feed = feed
        self.devices = devices
        self.serving = serving

    async def GetStatus(self, request: status_pb2.GetStatusRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> status_pb2.GetStatusReply:
        return status_pb2.GetStatusReply(**self.control.status(),
                                         not_serving=self.serving() if self.serving is not None else "")

    async def WatchTopology(self, request: status_pb2.WatchTopologyRequest,  # noqa: N802
                            context: grpc.aio.ServicerContext) -> Any:
        if self.feed is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "this daemon knows no topology")
            return
        async for text in self.feed.texts(request.min_interval):
            yield status_pb2.TopologyReply(topology=text)

    async def WatchDevices(self, request: status_pb2.WatchDevicesRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> Any:
        if self.devices is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this cri-resmgr is no DRA driver (--dra-driver)")
            return
        async for text in self.devices.feed.texts(request.min_interval):
            yield status_pb2.DevicesReply(driver=self.devices.driver, devices=text)

async def serve(control: ConfigManager, path: str, feed: StateFeed | None = None,
                group: int = -1, devices: Devices | None = None,
                serving: Callable[[], str] | None = None) -> grpc.aio.Server:
    """The link on a root-only socket; group (>= 0): its members may connect too; serving():
    why the daemon takes no runtime calls now ("": it does)."""
    server = grpc.aio.server()
    api_pb2_grpc.add_ConfigServicer_to_server(ConfigService(control), server)
    status_pb2_grpc.add_StatusServicer_to_server(StatusService(control, feed, devices, serving), server)
    await sockets.start_private(server, path)
    if group >= 0:
        sockets.grant_group(path, group)
    log.info("config link serving on %s", path)
    return server
