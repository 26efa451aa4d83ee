"""kubelet's plugin registration and DRA node service as written in protos/: the method paths
kubelet calls and the field numbers it sends, checked on a real unix socket with raw bytes."""

from __future__ import annotations

import grpc
import pytest

from resmgr.generated.dra import api_pb2 as dra
from resmgr.generated.dra import api_pb2_grpc as dra_grpc
from resmgr.generated.pluginregistration import api_pb2 as reg
from resmgr.generated.pluginregistration import api_pb2_grpc as reg_grpc


class Registration(reg_grpc.RegistrationServicer):
    async def GetInfo(self, request, context):  # noqa: N802
        return reg.PluginInfo(type="DRAPlugin", name="cpu.cri-resmgr", endpoint="/p/dra.sock",
                              supported_versions=["v1.DRAPlugin"])


class Plugin(dra_grpc.DRAPluginServicer):
    async def NodePrepareResources(self, request, context):  # noqa: N802
        return dra.NodePrepareResourcesResponse(claims={c.uid: dra.NodePrepareResourceResponse(devices=[
            dra.Device(request_names=["cpus"], pool_name="node-0", device_name="numa0",
                       cdi_device_ids=[f"cri-resmgr.io/cpu={c.uid}"])]) for c in request.claims})


@pytest.mark.asyncio
async def test_kubelet_reaches_both_services_at_their_published_paths_and_fields(tmp_path):
    server = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(Registration(), server)
    dra_grpc.add_DRAPluginServicer_to_server(Plugin(), server)
    path = f"unix://{tmp_path}/plugin.sock"
    server.add_insecure_port(path)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(path) as channel:
            raw = channel.unary_unary("/pluginregistration.Registration/GetInfo")
            info = reg.PluginInfo.FromString(await raw(b""))
            assert (info.type, info.name, info.endpoint) == ("DRAPlugin", "cpu.cri-resmgr", "/p/dra.sock")
            # Claim{namespace=1, uid=2, name=3} inside NodePrepareResourcesRequest.claims=1, as kubelet encodes it.
            claim = b"\n\x02ns\x12\x03u-1\x1a\x01c"
            raw = channel.unary_unary("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources")
            answer = await raw(b"\n" + bytes([len(claim)]) + claim)
            got = dra.NodePrepareResourcesResponse.FromString(answer).claims["u-1"].devices[0]
            assert (got.pool_name, got.device_name, list(got.cdi_device_ids)) == ("node-0", "numa0",
                                                                                   ["cri-resmgr.io/cpu=u-1"])
            # Device{request_names=1, pool_name=2, device_name=3, cdi_device_ids=4}, error=2 in the entry.
            assert dra.Device(request_names=["r"], pool_name="p", device_name="d", cdi_device_ids=["x"]) \
                .SerializeToString() == b"\n\x01r\x12\x01p\x1a\x01d\"\x01x"
            assert dra.NodePrepareResourceResponse(error="e").SerializeToString() == b"\x12\x01e"
            assert dra.NodeUnprepareResourceResponse(error="e").SerializeToString() == b"\n\x01e"
            assert reg.RegistrationStatus(plugin_registered=True, error="e").SerializeToString() == b"\x08\x01\x12\x01e"
    finally:
        await server.stop(0)
