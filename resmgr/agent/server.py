"""The Agent gRPC service: cluster operations on this node for cri-resmgr, and health; and the
Claims service its DRA driver reads ResourceClaims through."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any

import grpc

from resmgr import sockets
from resmgr.agent.agent import NodeAgent
from resmgr.agent.apiclient import ApiError
from resmgr.agent.kube import get_claim
from resmgr.generated.agent import api_pb2, api_pb2_grpc, claims_pb2, claims_pb2_grpc


async def _cluster(context: grpc.aio.ServicerContext, call: Awaitable[Any]) -> Any:
    """A call's answer, or the API server's error as a gRPC status."""
    try:
        return await call
    except ApiError as err:
        if not err.status:  # the API server is not reachable
            await context.abort(grpc.StatusCode.UNAVAILABLE, err.reason)
        code = {404: grpc.StatusCode.NOT_FOUND, 403: grpc.StatusCode.PERMISSION_DENIED}.get(
            err.status, grpc.StatusCode.UNAVAILABLE if err.status >= 500 else grpc.StatusCode.FAILED_PRECONDITION)
        await context.abort(code, f"API server answered {err.status} {err.reason}: {err.body}")


class AgentService(api_pb2_grpc.AgentServicer):
    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    async def GetNode(self, request: api_pb2.GetNodeRequest,  # noqa: N802 - gRPC method names
                      context: grpc.aio.ServicerContext) -> api_pb2.GetNodeReply:
        node = await _cluster(context, self.agent.cluster.get_node())
        return api_pb2.GetNodeReply(node=json.dumps(node))

    async def PatchNode(self, request: api_pb2.PatchNodeRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> api_pb2.PatchNodeReply:
        patches = []
        for p in request.patches:
            patch = {"op": p.op, "path": p.path}
            if p.op in ("add", "replace", "test"):
                try:
                    patch["value"] = json.loads(p.value)
                except ValueError:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"patch {p.path}: value is not JSON")
            elif p.op in ("move", "copy"):
                patch["from"] = p.value
            patches.append(patch)
        await _cluster(context, self.agent.cluster.patch_node(patches))
        return api_pb2.PatchNodeReply()

    async def UpdateNodeCapacity(self, request: api_pb2.UpdateNodeCapacityRequest,  # noqa: N802
                                 context: grpc.aio.ServicerContext) -> api_pb2.UpdateNodeCapacityReply:
        bad = [name for name in request.capacities if "/" not in name]
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"only extended resources (domain/name) may be set, not {', '.join(sorted(bad))}")
        await _cluster(context, self.agent.cluster.update_capacity(dict(request.capacities)))
        return api_pb2.UpdateNodeCapacityReply()

    async def GetConfig(self, request: api_pb2.GetConfigRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> api_pb2.GetConfigReply:
        choice = self.agent.choice()
        return api_pb2.GetConfigReply(node_name=self.agent.settings.node_name,
                                      config=choice.data if choice else {})

    async def HealthCheck(self, request: api_pb2.HealthCheckRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> api_pb2.HealthCheckReply:
        return api_pb2.HealthCheckReply(error=self.agent.health())


class ClaimsService(claims_pb2_grpc.ClaimsServicer):
    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    async def GetResourceClaim(self, request: claims_pb2.GetResourceClaimRequest,  # noqa: N802
                               context: grpc.aio.ServicerContext) -> claims_pb2.GetResourceClaimReply:
        claim = await _cluster(context, get_claim(self.agent.cluster.api, request.namespace, request.name))
        return claims_pb2.GetResourceClaimReply(claim=json.dumps(claim))


async def serve(agent: NodeAgent, path: str) -> grpc.aio.Server:
    server = grpc.aio.server()
    api_pb2_grpc.add_AgentServicer_to_server(AgentService(agent), server)
    claims_pb2_grpc.add_ClaimsServicer_to_server(ClaimsService(agent), server)
    await sockets.start_private(server, path)
    return server
