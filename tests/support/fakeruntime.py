"""A scripted CRI runtime for engine tests: what it lists, what it reports, what it was sent."""

from __future__ import annotations

import json

import grpc

from resmgr.generated.cri import api_pb2 as cri


class RuntimeError_(Exception):
    """A failed runtime call with a gRPC status code, as the relay's send raises it."""

    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class FakeRuntime:
    def __init__(self) -> None:
        self.pods: list[cri.PodSandbox] = []
        self.containers: list[cri.Container] = []
        self.updates: list[tuple[str, cri.LinuxContainerResources]] = []
        self.cpusets: dict[str, str] = {}  # what ContainerStatus reports, by container ID
        self.cdi: dict[str, list[str]] = {}  # the CDI devices a container was created with, by ID
        self.fail_updates = False

    async def version(self):
        return cri.VersionResponse(runtime_name="containerd")

    async def list_pods(self):
        return list(self.pods)

    async def pod_status(self, pod_id):
        return cri.PodSandboxStatusResponse(info={"info": '{"config": {"linux": {"cgroup_parent": '
                                                          '"/kubepods/burstable/podx"}}}'})

    async def list_containers(self, pod_id=""):
        return [c for c in self.containers if not pod_id or c.pod_sandbox_id == pod_id]

    async def container_status(self, cid, verbose=True):
        # The verbose info as containerd writes it: the CRI config in JSON, CDI_devices among it.
        config = {"CDI_devices": [{"name": n} for n in self.cdi.get(cid, [])]}
        return cri.ContainerStatusResponse(status=cri.ContainerStatus(
            id=cid, resources=cri.ContainerResources(linux=cri.LinuxContainerResources(
                cpu_shares=2, cpuset_cpus=self.cpusets.get(cid, "")))),
            info={"info": json.dumps({"config": config})} if verbose else {})

    async def update_resources(self, cid, res):
        if self.fail_updates:
            raise RuntimeError_(grpc.StatusCode.UNAVAILABLE, "runtime away")
        self.updates.append((cid, res))
        self.cpusets[cid] = res.cpuset_cpus

    def run(self, cid, pod_id, name="a", attempt=0, state=cri.CONTAINER_RUNNING):
        """A container the runtime lists (state: a CRI ContainerState)."""
        self.containers = [c for c in self.containers if c.id != cid]
        self.containers.append(cri.Container(id=cid, pod_sandbox_id=pod_id, state=state,
                                             metadata=cri.ContainerMetadata(name=name, attempt=attempt)))

    def pod(self, pod_id):
        self.pods.append(cri.PodSandbox(id=pod_id, state=cri.SANDBOX_READY,
                                        metadata=cri.PodSandboxMetadata(name=pod_id, uid=pod_id, namespace="ns")))
