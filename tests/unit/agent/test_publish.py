"""The agent's publishers on a real gRPC stream: the ResourceSlice made of what cri-resmgr offers,
and written again when cri-resmgr comes back, though nothing changed (the slice may be gone)."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import grpc
import pytest

from resmgr.agent.kube import Backoff
from resmgr.agent.publish import NUMA_NODE, SliceExporter, SliceShape, device, slice_name
from resmgr.generated.config import status_pb2, status_pb2_grpc

DEVICES = [{"name": "numa-0", "attributes": {"kind": "numa", "numaNode": 0, "big": True}, "cpus": 3, "cpuset": "1-3"}]


class Status(status_pb2_grpc.StatusServicer):
    """Each WatchDevices call sends the same devices once, then ends: cri-resmgr going away."""

    def __init__(self) -> None:
        self.calls = 0

    async def WatchDevices(self, request, context):  # noqa: N802
        self.calls += 1
        yield status_pb2.DevicesReply(driver="cpu.example.com", devices=json.dumps(DEVICES))


class Writes:
    node_name = "node-a"

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def owner(self, node: dict | None) -> list[dict[str, Any]]:
        return [{"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": "n-uid"}]

    async def put_slice(self, body: dict[str, Any]) -> None:
        self.bodies.append(body)


@pytest.fixture
def socket_path():
    d = Path(tempfile.mkdtemp(prefix="crirm-pub-"))
    yield str(d / "status.sock")
    shutil.rmtree(d, ignore_errors=True)


async def test_the_slice_is_written_again_after_cri_resmgr_comes_back(socket_path: str) -> None:
    server = grpc.aio.server()
    status = Status()
    status_pb2_grpc.add_StatusServicer_to_server(status, server)
    server.add_insecure_port("unix:" + socket_path)
    await server.start()
    writes = Writes()
    exporter = SliceExporter(writes, socket_path, 0.01, lambda: None, lambda: Backoff(0.01, 0.02))  # type: ignore[arg-type]
    task = asyncio.create_task(exporter.run())
    try:
        async with asyncio.timeout(10):
            while len(writes.bodies) < 2:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(0)
    assert status.calls >= 2
    body = writes.bodies[0]
    assert body["metadata"]["name"] == slice_name("node-a", "cpu.example.com") == "node-a-cpu.example.com"
    assert body["metadata"]["ownerReferences"][0]["kind"] == "Node"
    spec = body["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"], spec["pool"]["resourceSliceCount"]) == \
        ("cpu.example.com", "node-a", "node-a", 1)
    assert spec["devices"] == [{"name": "numa-0", "attributes": {"big": {"bool": True}, "kind": {"string": "numa"},
                                                                 "numaNode": {"int": 0}},
                                "capacity": {"cpu": {"value": "3"}}, "allowMultipleAllocations": True}]
    assert writes.bodies[1]["spec"]["pool"]["generation"] > spec["pool"]["generation"]


def test_overlapping_devices_share_counters_in_a_slice_of_their_own() -> None:
    numa = {"name": "numa-0", "attributes": {"kind": "numa"}, "cpus": 8,
            "consumes": {"package-0": {"l3-0": 4, "l3-4": 4}}}
    l3 = {"name": "l3-0", "attributes": {"kind": "l3"}, "cpus": 4, "consumes": {"package-0": {"l3-0": 4}}}
    exporter = SliceExporter(Writes(), "", 1, lambda: None, lambda: Backoff(0.01, 0.02))  # type: ignore[arg-type]
    body = exporter.body({"driver": "cpu.example.com", "devices": [numa, l3]})
    counters, devices = body["slices"]
    assert counters["metadata"]["name"] == "node-a-cpu.example.com-counters"
    assert counters["spec"]["sharedCounters"] == [
        {"name": "package-0", "counters": {"l3-0": {"value": "4"}, "l3-4": {"value": "4"}}}]
    assert "devices" not in counters["spec"] and "sharedCounters" not in devices["spec"]
    assert counters["spec"]["pool"] == devices["spec"]["pool"] == {"name": "node-a", "generation": 0,
                                                                   "resourceSliceCount": 2}
    assert devices["spec"]["devices"][0]["consumesCounters"] == [
        {"counterSet": "package-0", "counters": {"l3-0": {"value": "4"}, "l3-4": {"value": "4"}}}]


def test_a_device_as_gated_clusters_take_it() -> None:
    d = {"name": "numa-1", "attributes": {"kind": "numa", NUMA_NODE: 1}, "cpus": 4}
    assert device(d)["attributes"][NUMA_NODE] == {"int": 1}
    assert "nodeAllocatableResources" not in device(d)
    gated = device(d, SliceShape(node_allocatable=True, numa_list=True))
    assert gated["attributes"] == {"kind": {"string": "numa"}, NUMA_NODE: {"ints": [1]}}
    # Each claimed CPU is one CPU of the node's allocatable.
    assert gated["nodeAllocatableResources"] == {
        "cpu": {"mapping": {"capacityKey": "cpu", "capacityMultiplier": "1"}}}
    # A device spanning NUMA nodes lists them where lists are taken, and has no standard attribute else.
    wide = {**d, "attributes": {"kind": "l3", NUMA_NODE: [0, 1]}}
    assert device(wide, SliceShape(numa_list=True))["attributes"] == {"kind": {"string": "l3"},
                                                                      NUMA_NODE: {"ints": [0, 1]}}
    assert device(wide)["attributes"] == {"kind": {"string": "l3"}}


def test_devices_beyond_one_slice_go_on_in_more() -> None:
    cpus = [{"name": f"cpu-{c}", "attributes": {"kind": "cpu"}, "cpus": 1} for c in range(300)]
    exporter = SliceExporter(Writes(), "", 1, lambda: None, lambda: Backoff(0.01, 0.02))  # type: ignore[arg-type]
    slices = exporter.body({"driver": "cpu.example.com", "devices": cpus})["slices"]
    assert [s["metadata"]["name"] for s in slices] == ["node-a-cpu.example.com", "node-a-cpu.example.com-2",
                                                      "node-a-cpu.example.com-3"]
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    # With list attributes a slice holds 64.
    exporter.shape = SliceShape(numa_list=True)
    slices = exporter.body({"driver": "cpu.example.com", "devices": cpus})["slices"]
    assert [len(s["spec"]["devices"]) for s in slices] == [64] * 4 + [44]
    # No devices: one empty slice says so.
    assert exporter.body({"driver": "cpu.example.com", "devices": []})["slices"][0]["spec"]["devices"] == []
