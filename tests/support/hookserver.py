"""A runtime hook plugin process for the tests: the example plugin, plus scripted misbehaviour.

    python -m tests.support.hookserver --socket S [--name N] [--mode answer|echo|error|hang|crash|slow]
                               [--delay SECONDS] [--only-label KEY=VALUE] [--record FILE] [--cpuset CPUS]

Every call is appended to the record file as one JSON line {"hook", "request", "time"}
before the plugin acts. Modes: answer (the example plugin's changes), echo (the request's
own values back), error (INVALID_ARGUMENT), hang (never answers), crash (the process
exits mid-call), slow (answers after --delay). --only-label limits the misbehaviour to
pods with that label; others get answers. --cpuset asks for those CPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import grpc
from google.protobuf.json_format import MessageToDict

from examples.hook_plugin import ExamplePlugin, serve
from resmgr.generated.hooks import api_pb2 as pb

HOOKS = ("PreRunPodSandbox", "PostStopPodSandbox", "PreCreateContainer", "PreStartContainer",
         "PostStartContainer", "PostStopContainer", "PreUpdateContainerResources")


class TestPlugin(ExamplePlugin):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args.name)
        self.args = args
        self.only = tuple(args.only_label.split("=", 1)) if args.only_label else None

    def _record(self, hook: str, request: object) -> None:
        if self.args.record:
            line = json.dumps({"hook": hook, "plugin": self.name, "time": time.time(),
                               "request": MessageToDict(request, preserving_proto_field_name=True)})
            with open(self.args.record, "a") as f:
                f.write(line + "\n")

    def _misbehaves(self, request: object) -> bool:
        if self.only is None:
            return True
        labels = getattr(request, "pod_labels", None)
        if labels is None:
            labels = getattr(request, "labels", {})
        return labels.get(self.only[0]) == self.only[1]

    async def _handle(self, hook: str, request: object, context: grpc.aio.ServicerContext) -> object:
        self._record(hook, request)
        mode = self.args.mode if self._misbehaves(request) else "answer"
        if mode == "error":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.name} says no")
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "crash":
            os._exit(3)
        if mode == "slow":
            await asyncio.sleep(self.args.delay)
        if isinstance(request, pb.PodSandboxHookRequest):
            resp = pb.PodSandboxHookResponse()
            if mode == "echo":
                resp.labels.update(request.labels)
                resp.annotations.update(request.annotations)
                resp.cgroup_parent = request.cgroup_parent
            else:
                resp.labels["hooked-by"] = self.name
                resp.annotations["example.com/hooked-by"] = self.name
            return resp
        if mode == "echo":
            return pb.ContainerResourceHookResponse(
                container_annotations=request.container_annotations, container_resources=request.container_resources,
                pod_cgroup_parent=request.pod_cgroup_parent, container_envs=request.container_envs)
        resp = self.adjust(request)
        if self.args.cpuset:
            resp.container_resources.cpuset_cpus = self.args.cpuset
        return resp


def _method(hook: str):  # noqa: ANN202 - a servicer method
    async def method(self: TestPlugin, request: object, context: grpc.aio.ServicerContext) -> object:
        return await self._handle(hook, request, context)
    return method


for _hook in HOOKS:
    setattr(TestPlugin, f"{_hook}Hook", _method(_hook))


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--name", default="test-hook")
    p.add_argument("--mode", default="answer", choices=["answer", "echo", "error", "hang", "crash", "slow"])
    p.add_argument("--delay", type=float, default=0.5)
    p.add_argument("--only-label", default="")
    p.add_argument("--record", default="")
    p.add_argument("--cpuset", default="")
    args = p.parse_args()
    server = await serve(args.socket, TestPlugin(args))
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())
