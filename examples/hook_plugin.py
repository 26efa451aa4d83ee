"""A runtime hook plugin: a RuntimeHookService server cri-resmgr calls around lifecycle calls.

Before a container is created it
- sets the environment variable HOOKED_BY to the plugin's name,
- sets the annotation example.com/hooked-by to the same,
- caps the container's CPU quota when its pod has the label example.com/cpu-cap
  (in millicores, e.g. "250m" or "1"): the quota becomes at most cap x period.

Register it with a file in cri-resmgr's hook directory (/etc/runtime/hookserver.d):

    {"remote-endpoint": "/run/example-hook.sock", "failure-policy": "Ignore",
     "runtime-hooks": ["PreCreateContainer", "PreUpdateContainerResources"]}

and run it:  python examples/hook_plugin.py --socket /run/example-hook.sock
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

import grpc

from resmgr.generated.hooks import api_pb2 as pb
from resmgr.generated.hooks import api_pb2_grpc as pb_grpc

CAP_LABEL = "example.com/cpu-cap"
DEFAULT_PERIOD = 100_000  # the kernel's default CFS period, in microseconds

log = logging.getLogger("example-hook")


def millicores(text: str) -> int | None:
    """'250m' -> 250, '2' -> 2000; None when it is not a quantity."""
    try:
        return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)
    except ValueError:
        return None


class ExamplePlugin(pb_grpc.RuntimeHookServiceServicer):
    def __init__(self, name: str = "example-hook") -> None:
        self.name = name

    def adjust(self, req: pb.ContainerResourceHookRequest) -> pb.ContainerResourceHookResponse:
        """What this plugin changes in a container: answer only the fields to change."""
        resp = pb.ContainerResourceHookResponse()
        resp.container_envs["HOOKED_BY"] = self.name
        resp.container_annotations["example.com/hooked-by"] = self.name
        cap = millicores(req.pod_labels.get(CAP_LABEL, ""))
        if cap is not None and cap > 0:
            period = req.container_resources.cpu_period or DEFAULT_PERIOD
            quota = req.container_resources.cpu_quota
            capped = cap * period // 1000
            if quota <= 0 or quota > capped:  # no limit yet, or a higher one
                resp.container_resources.cpu_period = period
                resp.container_resources.cpu_quota = capped
        return resp

    async def PreCreateContainerHook(self, request: pb.ContainerResourceHookRequest,
                                     context: grpc.aio.ServicerContext) -> pb.ContainerResourceHookResponse:
        log.info("PreCreateContainer %s/%s/%s", request.pod_meta.namespace, request.pod_meta.name,
                 request.container_meta.name)
        return self.adjust(request)

    async def PreUpdateContainerResourcesHook(self, request: pb.ContainerResourceHookRequest,
                                              context: grpc.aio.ServicerContext) -> pb.ContainerResourceHookResponse:
        resp = self.adjust(request)
        resp.ClearField("container_envs")  # a running container's environment cannot change
        return resp


async def serve(socket: str, servicer: pb_grpc.RuntimeHookServiceServicer) -> grpc.aio.Server:
    """Serve servicer on a unix socket (a stale socket file is replaced)."""
    if os.path.exists(socket):
        os.unlink(socket)
    server = grpc.aio.server()
    pb_grpc.add_RuntimeHookServiceServicer_to_server(servicer, server)
    server.add_insecure_port("unix://" + socket)
    await server.start()
    return server


async def main() -> None:
    parser = argparse.ArgumentParser(description="example cri-resmgr runtime hook plugin")
    parser.add_argument("--socket", default="/run/example-hook.sock", help="unix socket to serve on")
    parser.add_argument("--name", default="example-hook", help="what HOOKED_BY is set to")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    server = await serve(args.socket, ExamplePlugin(args.name))
    log.info("serving on %s", args.socket)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())
