"""kubelet as the simulated node's cri-resmgr meets it: pods made, resized and deleted at random,
one worker per pod doing one thing at a time, every CRI call under its runtime request timeout and
tried again after a failure, as kubelet's pod workers do (a create that failed may have happened:
what it left is removed and the container made again, one attempt more)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.sim.containerd import CallError
from resmgr.generated.cri import api_pb2 as cri
from resmgr.requests import milli_to_shares

if TYPE_CHECKING:
    from harness.sim.node import Node

TIMEOUT = 120.0  # kubelet's runtimeRequestTimeout (its default: 2m)
ADMITTED = 15000  # milli-CPUs kubelet admits: 16 CPUs less the reserved one
KINDS = {"g1": ("guaranteed", 1000), "g2": ("guaranteed", 2000), "bu": ("burstable", 500), "be": ("besteffort", 0)}


@dataclass
class PodRun:
    name: str
    qos: str
    milli: int
    config: cri.PodSandboxConfig
    sandbox: str = ""
    container: str = ""
    attempt: int = 0
    deleting: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def resources(qos: str, milli: int) -> cri.LinuxContainerResources:
    guaranteed = qos == "guaranteed"
    return cri.LinuxContainerResources(cpu_shares=milli_to_shares(milli), cpu_period=100000,
                                       cpu_quota=milli * 100 if guaranteed else 0,
                                       memory_limit_in_bytes=64 << 20 if guaranteed else 0)


class Kubelet:
    def __init__(self, node: Node, rng: random.Random) -> None:
        self.node, self.rng = node, rng
        self.pods: dict[str, PodRun] = {}
        self.workers: set[asyncio.Task[Any]] = set()
        self._n = 0

    async def run(self, steps: int) -> None:
        """steps actions, about 2 s apart: a pod made, deleted or resized."""
        for _ in range(steps):
            await asyncio.sleep(self.rng.expovariate(0.5))
            action = self.rng.choices(("make", "delete", "resize"), (5, 3, 2))[0]
            if action == "make":
                self.make(self.rng.choice(list(KINDS)))
            elif action == "delete" and (live := self.live()):
                self.delete(self.rng.choice(live))
            elif action == "resize" and (sized := [p for p in self.live() if p.qos == "guaranteed"]):
                self.spawn(self.resize(self.rng.choice(sized)))

    async def delete_all(self) -> None:
        for p in self.live():
            self.delete(p)
        while self.workers:
            await asyncio.gather(*list(self.workers), return_exceptions=True)
        await self.collect_garbage()

    async def collect_garbage(self) -> None:
        """kubelet's garbage collection: sandboxes of no pod it has (a RunPodSandbox it gave up on
        that containerd made later, after a freeze) stopped and removed, with their containers."""
        mine = {p.config.metadata.uid for p in self.pods.values()}
        for sb in [sb for sb in self.node.ctrd.sandboxes.values() if sb.config.metadata.uid not in mine]:
            calls: list[Any] = [cri.StopContainerRequest(container_id=c.id, timeout=30)
                                for c in self.node.ctrd.containers.values() if c.pod_id == sb.id]
            calls += [cri.StopPodSandboxRequest(pod_sandbox_id=sb.id),
                      cri.RemovePodSandboxRequest(pod_sandbox_id=sb.id)]
            for req in calls:
                for _ in range(10):  # as the next collections would
                    try:
                        await self.node.call(req, TIMEOUT)
                        break
                    except CallError as err:
                        self.node.note(f"kubelet: garbage collection: {err}")
                        await asyncio.sleep(5.0)

    def live(self) -> list[PodRun]:
        return [p for p in self.pods.values() if not p.deleting]

    def make(self, kind: str) -> None:
        qos, milli = KINDS[kind]
        if sum(p.milli for p in self.pods.values()) + milli > ADMITTED:
            return  # kubelet's admission: the node's CPUs are all requested
        self._n += 1
        name = f"{kind}-{self._n}"
        uid = f"uid{self._n:04d}{self.rng.getrandbits(32):08x}"
        parent = f"/kubepods/pod{uid}" if qos == "guaranteed" else f"/kubepods/{qos}/pod{uid}"
        config = cri.PodSandboxConfig(metadata=cri.PodSandboxMetadata(name=name, uid=uid, namespace="default"),
                                      linux=cri.LinuxPodSandboxConfig(cgroup_parent=parent))
        pod = self.pods[name] = PodRun(name, qos, milli, config)
        self.spawn(self.create(pod))

    def delete(self, pod: PodRun) -> None:
        pod.deleting = True
        self.spawn(self.terminate(pod))

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.workers.add(task)
        task.add_done_callback(self.workers.discard)

    # -- one pod's worker ----------------------------------------------------------------------------
    async def _until(self, pod: PodRun, what: str, req: Any, give_up: bool = False) -> Any:
        """The call, tried again after each failure (a backoff between) while the pod is wanted."""
        delay = 1.0
        while True:
            try:
                return await self.node.call(req, TIMEOUT)
            except CallError as err:
                self.node.note(f"kubelet: {pod.name} {what}: {err}")
                if give_up or (pod.deleting and what in ("run", "create", "start", "resize")):
                    return None
            await asyncio.sleep(self.rng.uniform(0.5, 1.0) * delay)
            delay = min(delay * 2, 10.0)

    async def create(self, pod: PodRun) -> None:
        async with pod.lock:
            resp = await self._until(pod, "run", cri.RunPodSandboxRequest(config=pod.config))
            if resp is None:
                return
            pod.sandbox = resp.pod_sandbox_id
            while not pod.deleting:
                config = cri.ContainerConfig(metadata=cri.ContainerMetadata(name="main", attempt=pod.attempt),
                                             linux=cri.LinuxContainerConfig(resources=resources(pod.qos, pod.milli)))
                resp = await self._until(pod, "create", cri.CreateContainerRequest(
                    pod_sandbox_id=pod.sandbox, config=config, sandbox_config=pod.config), give_up=True)
                if resp is not None:
                    pod.container = resp.container_id
                    if await self._until(pod, "start", cri.StartContainerRequest(container_id=pod.container),
                                         give_up=True) is not None or pod.deleting:
                        return  # deleted meanwhile: its termination finds it made, not started
                if await self._made_anyway(pod):
                    return
                pod.attempt += 1
                await asyncio.sleep(self.rng.uniform(1.0, 10.0))

    async def _made_anyway(self, pod: PodRun) -> bool:
        """After a failed create or start, what kubelet's next look at the runtime finds: its container
        running (the call happened), or made and not started, which it removes before making another."""
        for c in list(self.node.ctrd.containers.values()):
            if c.pod_id != pod.sandbox or c.config.metadata.attempt != pod.attempt:
                continue
            if c.state == cri.CONTAINER_RUNNING:
                pod.container = c.id
                return True
            await self._until(pod, "remove", cri.RemoveContainerRequest(container_id=c.id))
        return False

    async def resize(self, pod: PodRun) -> None:
        async with pod.lock:
            if pod.deleting or not pod.container:
                return
            milli = 3000 - pod.milli  # 1 CPU to 2, 2 to 1
            if sum(p.milli for p in self.pods.values()) - pod.milli + milli > ADMITTED:
                return
            if await self._until(pod, "resize", cri.UpdateContainerResourcesRequest(
                    container_id=pod.container, linux=resources(pod.qos, milli))) is not None:
                pod.milli = milli

    async def terminate(self, pod: PodRun) -> None:
        """Every sandbox of the pod's UID the runtime lists goes, as kubelet's relist groups them: also
        one a RunPodSandbox made whose answer was lost (the relay killed under it). As kubelet kills a
        pod: its running containers stopped, then its sandbox; its containers removed after (garbage
        collection), also one made and never started, which stayed created in the stopped pod."""
        async with pod.lock:
            uid = pod.config.metadata.uid
            for sandbox in [sb.id for sb in self.node.ctrd.sandboxes.values() if sb.config.metadata.uid == uid]:
                for c in [c for c in self.node.ctrd.containers.values() if c.pod_id == sandbox]:
                    if c.state != cri.CONTAINER_CREATED:
                        await self._until(pod, "stop", cri.StopContainerRequest(container_id=c.id, timeout=30))
                await self._until(pod, "stop pod", cri.StopPodSandboxRequest(pod_sandbox_id=sandbox))
                if any(c.pod_id == sandbox and c.state == cri.CONTAINER_CREATED
                       for c in self.node.ctrd.containers.values()):
                    await asyncio.sleep(self.rng.uniform(1.0, 60.0))  # its garbage collection runs every minute
                for c in [c for c in self.node.ctrd.containers.values() if c.pod_id == sandbox]:
                    await self._until(pod, "remove", cri.RemoveContainerRequest(container_id=c.id))
                await self._until(pod, "remove pod", cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox))
            del self.pods[pod.name]
