"""The config link as the agent and `cri-resmgr status` use it: gRPC's own client against the link,
on a real unix socket."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from typing import Any

import grpc
import pytest

from resmgr.control import link
from resmgr.control.manager import Rejected
from resmgr.engine.state import Changes
from resmgr.generated.config import api_pb2, api_pb2_grpc, status_pb2, status_pb2_grpc
from resmgr.view.feed import StateFeed

pytestmark = pytest.mark.unit


class Control:
    """The config manager as the link sees it: pushes take a while, one node's are refused."""

    def __init__(self) -> None:
        self.pushed: list[tuple[str, dict[str, str]]] = []
        self.started, self.applied = asyncio.Event(), asyncio.Event()

    async def push(self, node: str, config: dict[str, str]) -> None:
        self.started.set()
        await asyncio.sleep(0.3)  # the work of applying it
        if node == "bad":
            raise Rejected("policy: no such policy")
        self.pushed.append((node, config))
        self.applied.set()

    def status(self) -> dict[str, Any]:
        return {"policy": "static", "pods": 2}


async def test_pushes_status_and_refusals_through_grpcs_own_client(tmp_path):
    path = str(tmp_path / "run" / "config.sock")
    control = Control()
    served = await link.serve(control, path, serving=lambda: "")  # type: ignore[arg-type]
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        async with grpc.aio.insecure_channel("unix://" + path) as channel:
            config = api_pb2_grpc.ConfigStub(channel)
            reply = await config.SetConfig(api_pb2.SetConfigRequest(node_name="n1", config={"policy": "x"}), timeout=5)
            assert reply.error == "" and control.pushed == [("n1", {"policy": "x"})]
            reply = await config.SetConfig(api_pb2.SetConfigRequest(node_name="bad"), timeout=5)
            assert "no such policy" in reply.error
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await config.SetAdjustment(api_pb2.SetAdjustmentRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
            status = await status_pb2_grpc.StatusStub(channel).GetStatus(status_pb2.GetStatusRequest(), timeout=5)
            assert (status.policy, status.pods) == ("static", 2)
            with pytest.raises(grpc.aio.AioRpcError) as info:  # no feed: no topology to follow
                async for _ in status_pb2_grpc.StatusStub(channel).WatchTopology(status_pb2.WatchTopologyRequest()):
                    pass
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await served.stop(1.0)
    assert _refused(path)  # nothing listens any more


async def test_a_shutdown_lets_a_push_in_flight_finish_and_ends_the_streams(tmp_path):
    path = str(tmp_path / "config.sock")
    control, changes = Control(), Changes()
    feed = StateFeed(lambda: {"n": changes.count}, changes)
    served = await link.serve(control, path, feed)  # type: ignore[arg-type]
    async with grpc.aio.insecure_channel("unix://" + path) as channel:
        watch = status_pb2_grpc.StatusStub(channel).WatchTopology(status_pb2.WatchTopologyRequest(min_interval=0))
        assert (await watch.read()).topology == '{"n": 0}'
        push = asyncio.ensure_future(api_pb2_grpc.ConfigStub(channel).SetConfig(
            api_pb2.SetConfigRequest(node_name="n1"), timeout=5))
        await asyncio.wait_for(control.started.wait(), 5)  # the push is being applied
        await asyncio.wait_for(served.stop(2.0), 3.0)
        assert (await push).error == "" and control.pushed == [("n1", {})]
        assert await asyncio.wait_for(watch.read(), 2.0) is grpc.aio.EOF  # ended, not failed: followed again
        assert await watch.code() == grpc.StatusCode.OK


def _refused(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
    except OSError:
        return True
    finally:
        s.close()
    return False


async def test_a_call_without_its_request_message_is_refused(tmp_path):
    from grpclib.client import Channel, StreamUnaryMethod
    from grpclib.const import Status
    from grpclib.exceptions import GRPCError

    path = str(tmp_path / "config.sock")
    control = Control()
    served = await link.serve(control, path)  # type: ignore[arg-type]
    channel = Channel(path=path)
    try:
        # A client-streaming call by its own account: it may end its side having sent nothing.
        method = StreamUnaryMethod(channel, link.CONFIG + "SetConfig", api_pb2.SetConfigRequest, api_pb2.SetConfigReply)
        with pytest.raises(GRPCError) as info:
            async with method.open(timeout=5) as stream:
                await stream.send_request(end=True)  # headers only
                await stream.recv_message()
        assert info.value.status == Status.INVALID_ARGUMENT and not control.pushed
    finally:
        channel.close()
        await served.stop(1.0)


async def test_a_push_whose_caller_gives_up_is_applied_whole(tmp_path):
    path = str(tmp_path / "config.sock")
    control = Control()
    served = await link.serve(control, path)  # type: ignore[arg-type]
    try:
        async with grpc.aio.insecure_channel("unix://" + path) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await api_pb2_grpc.ConfigStub(channel).SetConfig(api_pb2.SetConfigRequest(node_name="n1"), timeout=0.1)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(control.applied.wait(), 5)
        assert control.pushed == [("n1", {})]
    finally:
        await served.stop(1.0)
