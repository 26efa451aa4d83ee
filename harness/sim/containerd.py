"""containerd as the simulated node's kubelet and cri-resmgr meet it: its CRI calls, with the
latency and the behaviours this project has met on real nodes.

It serves two sides. The relay's `send` (the lifecycle calls kubelet makes through cri-resmgr)
is `Containerd.handle`; cri-resmgr's own calls (listing, status, updates) go through
`Containerd.client()`, which has the methods of the real RuntimeClient (resmgr/frontends/cri/
runtime.py), so CriRuntime - the production adapter - is what the engine talks through. What a
container's cgroup holds is `Ctr.cpus` and `Ctr.mems`, kept as containerd would write them.

Behaviours (each switched by `Quirks`):
- a pod's stop ends its running containers; one created and not started stays created (it has
  no task), and can never start;
- a start makes the task from the container's record as it reads it when the start begins: an
  update that lands while the task is being made is in the record, not in the cgroup;
- a stopped container is listed as running for a while (`list_lag`): its exit not yet handled,
  and an update to it meanwhile is refused with containerd's words ("cannot update a stopped
  container");
- an update that meets a removal of the same container is recorded (`update_meets_remove`):
  containerd 2.3.7 panics on it, so cri-resmgr must never send one;
- frozen (`freeze`): every call waits until the thaw, past kubelet's deadline;
- restarted (`restart`): the calls in flight fail with their connections (nothing of them done), new
  ones are refused until it is back; its containers and sandboxes stay, as a restart keeps them.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from resmgr.generated.cri import api_pb2 as cri
from resmgr.generated.nri import api_pb2 as nri
from resmgr.topology.cpuset import CPUSet

if TYPE_CHECKING:
    from harness.sim.nri import Adaptation

STOPPED = "cannot update a stopped container"
RESOURCE_FIELDS = ("cpuset_cpus", "cpuset_mems", "cpu_shares", "cpu_quota", "cpu_period", "memory_limit_in_bytes")


class CallError(Exception):
    """A failed CRI call, as grpc.aio raises it (code() and details())."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@dataclass
class Quirks:
    latency: tuple[float, float] = (0.001, 0.05)  # seconds each call takes
    start: tuple[float, float] = (0.01, 0.3)  # seconds a start takes from reading the spec to a running task
    list_lag: float = 3.0  # seconds a stopped container still lists as running (0: none)


@dataclass
class Sandbox:
    id: str
    config: cri.PodSandboxConfig
    state: int = cri.SANDBOX_READY


@dataclass
class Ctr:
    id: str
    pod_id: str
    config: cri.ContainerConfig
    state: int = cri.CONTAINER_CREATED
    spec: cri.LinuxContainerResources = field(default_factory=cri.LinuxContainerResources)  # its record
    resources: cri.LinuxContainerResources = field(default_factory=cri.LinuxContainerResources)  # its cgroup
    exited_at: float = 0.0
    removing: bool = False
    starting: bool = False  # a start is reading its spec and making its task
    task: bool = False  # its cgroup exists (NRI: made before the plugin hears of the start)
    unplugged: bool = False  # NRI: made or started while no plugin was there (its window)

    @property
    def cpus(self) -> CPUSet:
        return CPUSet.parse(self.resources.cpuset_cpus)


class Containerd:
    def __init__(self, rng: random.Random, loop: asyncio.AbstractEventLoop, online: CPUSet, quirks: Quirks) -> None:
        self.rng, self.loop, self.online, self.quirks = rng, loop, online, quirks
        self.sandboxes: dict[str, Sandbox] = {}
        self.containers: dict[str, Ctr] = {}
        self.freeze_until = 0.0
        self.down_until = 0.0  # restarting: calls refused until then
        self.epoch = 0  # its lives: a call that began in another fails
        self.broken: list[str] = []  # what it saw that breaks its rules (an update meeting a removal)
        self.on_change: Callable[[], None] = lambda: None  # after every change of a cgroup (the invariants)
        self.nri: Adaptation | None = None  # NRI mode: its plugin side (harness/sim/nri.py)
        self.swapping: set[frozenset[str]] = set()  # NRI: the pairs an answer swaps CPUs of, meanwhile
        self._n = 0

    # -- the relay's side: kubelet's calls ------------------------------------------------------------
    async def handle(self, req: Any) -> Any:
        await self._latency()
        name = type(req).__name__.removesuffix("Request")
        done = getattr(self, "_" + name)(req)
        return await done if asyncio.iscoroutine(done) else done

    async def _RunPodSandbox(self, req: cri.RunPodSandboxRequest) -> cri.RunPodSandboxResponse:
        sid = self._id("pod")
        sb = self.sandboxes[sid] = Sandbox(sid, req.config)
        if self.nri is not None:
            try:
                await self.nri.event("RunPodSandbox", nri.RunPodSandboxRequest(pod=self.nri.pod(sb)),
                                     nri.RunPodSandboxResponse)
            except CallError:
                self.sandboxes.pop(sid, None)  # containerd tears the sandbox down again
                raise
        return cri.RunPodSandboxResponse(pod_sandbox_id=sid)

    async def _StopPodSandbox(self, req: cri.StopPodSandboxRequest) -> cri.StopPodSandboxResponse:
        sb = self.sandboxes.get(req.pod_sandbox_id)
        if sb is not None:
            for c in self._of(sb.id):
                if c.state == cri.CONTAINER_RUNNING:  # one created, not started, stays created: no task
                    await self._stop(c)
            sb.state = cri.SANDBOX_NOTREADY
            await self._tell("StopPodSandbox", nri.StopPodSandboxRequest, nri.StopPodSandboxResponse, sb)
        return cri.StopPodSandboxResponse()

    async def _RemovePodSandbox(self, req: cri.RemovePodSandboxRequest) -> cri.RemovePodSandboxResponse:
        sb = self.sandboxes.get(req.pod_sandbox_id)
        for c in self._of(req.pod_sandbox_id):
            self._exit(c)
            self.containers.pop(c.id, None)
            if sb is not None:
                await self._tell("RemoveContainer", nri.RemoveContainerRequest, nri.RemoveContainerResponse, sb, c)
        self.sandboxes.pop(req.pod_sandbox_id, None)
        if sb is not None:
            await self._tell("RemovePodSandbox", nri.RemovePodSandboxRequest, nri.RemovePodSandboxResponse, sb)
        return cri.RemovePodSandboxResponse()

    async def _CreateContainer(self, req: cri.CreateContainerRequest) -> cri.CreateContainerResponse:
        sb = self.sandboxes.get(req.pod_sandbox_id)
        if sb is None:
            raise CallError(grpc.StatusCode.NOT_FOUND, f"sandbox {req.pod_sandbox_id} not found")
        cid = self._id("ctr")
        res = cri.LinuxContainerResources()
        res.CopyFrom(req.config.linux.resources)
        c = Ctr(cid, req.pod_sandbox_id, req.config, spec=res)
        if self.nri is not None:
            # Asked before containerd has the container: an update another create's answer carries
            # for this one meanwhile finds nothing, and is logged and ignored.
            resp = await self.nri.event("CreateContainer", nri.CreateContainerRequest(
                pod=self.nri.pod(sb), container=self.nri.container(c)), nri.CreateContainerResponse,
                f"{cid}'s create")
            if resp is None:
                c.unplugged = True
            else:
                adjusted = to_cri(resp.adjust.linux.resources)
                c.spec = merged(c.spec, adjusted)
                self.nri.note(f"containerd: {cid} created, adjusted to cpus {adjusted.cpuset_cpus or '-'}")
        if not c.spec.cpuset_cpus:
            c.spec.cpuset_cpus = str(self.online)  # the runtime's default: every CPU
        self.containers[cid] = c
        return cri.CreateContainerResponse(container_id=cid)

    async def _StartContainer(self, req: cri.StartContainerRequest) -> cri.StartContainerResponse:
        c = self._get(req.container_id)
        if c.state != cri.CONTAINER_CREATED or c.starting:
            raise CallError(grpc.StatusCode.UNKNOWN, f"container {c.id} is not in created state")
        c.starting = True
        read = cri.LinuxContainerResources()
        read.CopyFrom(c.spec)  # the task is made from the spec as it is now; an update meanwhile misses it
        try:
            await asyncio.sleep(self.rng.uniform(*self.quirks.start))
        finally:
            c.starting = False
        if c.state != cri.CONTAINER_CREATED or c.removing:
            raise CallError(grpc.StatusCode.UNKNOWN, f"container {c.id} went while it was started")
        c.resources, c.task = read, True
        sb = self.sandboxes.get(c.pod_id)
        if self.nri is not None and sb is not None:  # the task made, not yet started
            try:
                told = await self.nri.event("StartContainer", nri.StartContainerRequest(
                    pod=self.nri.pod(sb), container=self.nri.container(c)), nri.StartContainerResponse)
            except CallError:
                c.task = False
                c.state = cri.CONTAINER_EXITED  # containerd records a start that failed as an exit
                raise
            c.unplugged = c.unplugged or told is None
            if c.state != cri.CONTAINER_CREATED or c.removing:
                raise CallError(grpc.StatusCode.UNKNOWN, f"container {c.id} went while it was started")
        c.state = cri.CONTAINER_RUNNING
        self.on_change()
        if sb is not None:
            await self._tell("PostStartContainer", nri.PostStartContainerRequest, nri.PostStartContainerResponse,
                             sb, c)
        return cri.StartContainerResponse()

    async def _StopContainer(self, req: cri.StopContainerRequest) -> cri.StopContainerResponse:
        c = self.containers.get(req.container_id)
        if c is not None:
            await self._stop(c)
        return cri.StopContainerResponse()

    async def _stop(self, c: Ctr) -> None:
        running = c.state == cri.CONTAINER_RUNNING
        self._exit(c)
        sb = self.sandboxes.get(c.pod_id)
        if running and self.nri is not None and sb is not None:
            try:
                await self.nri.event("StopContainer", nri.StopContainerRequest(
                    pod=self.nri.pod(sb), container=self.nri.container(c)), nri.StopContainerResponse,
                    f"{c.id}'s stop")
            except CallError:
                return  # logged; the stop stands

    async def _RemoveContainer(self, req: cri.RemoveContainerRequest) -> cri.RemoveContainerResponse:
        c = self.containers.get(req.container_id)
        if c is not None:  # a removal takes a while (the task deleted, its rootfs unmounted)
            self._exit(c)
            c.removing = True
            await asyncio.sleep(self.rng.uniform(*self.quirks.latency))
            self.containers.pop(c.id, None)
            sb = self.sandboxes.get(c.pod_id)
            if sb is not None:
                await self._tell("RemoveContainer", nri.RemoveContainerRequest, nri.RemoveContainerResponse, sb, c)
        return cri.RemoveContainerResponse()

    async def _UpdateContainerResources(self, req: cri.UpdateContainerResourcesRequest
                                        ) -> cri.UpdateContainerResourcesResponse:
        c = self._get(req.container_id)
        sb = self.sandboxes.get(c.pod_id)
        if self.nri is None or sb is None:
            self._update(req.container_id, req.linux)
            return cri.UpdateContainerResourcesResponse()
        # The others' updates the answer carries first (under the NRI lock), the container's own last.
        try:
            resp = await self.nri.event("UpdateContainer", nri.UpdateContainerRequest(
                pod=self.nri.pod(sb), container=self.nri.container(c), linux_resources=to_nri(req.linux)),
                nri.UpdateContainerResponse, f"{c.id}'s update", but=c.id)
            mine = [u for u in resp.update if u.container_id == c.id] if resp is not None else []
            self._update(c.id, merged(req.linux, to_cri(mine[-1].linux.resources)) if mine else req.linux)
        finally:
            self.swapping = {p for p in self.swapping if c.id not in p}
        if resp is not None:
            await self._tell("PostUpdateContainer", nri.PostUpdateContainerRequest, nri.PostUpdateContainerResponse,
                             sb, c)
        return cri.UpdateContainerResourcesResponse()

    async def _tell(self, method: str, request: Any, answer: Any, sb: Sandbox, c: Ctr | None = None) -> None:
        """An event whose answer carries nothing; a failure is logged and changes nothing."""
        if self.nri is None:
            return
        fields = {"pod": self.nri.pod(sb)}
        if c is not None:
            fields["container"] = self.nri.container(c)
        try:
            await self.nri.event(method, request(**fields), answer)
        except CallError:
            pass

    # -- cri-resmgr's own calls ----------------------------------------------------------------------
    def client(self) -> Client:
        return Client(self)

    def _update(self, cid: str, res: cri.LinuxContainerResources) -> None:
        c = self._get(cid)
        if c.removing:
            self.broken.append(f"an update of {cid} met its removal (containerd 2.3.7 panics)")
            self.on_change()
        if c.state == cri.CONTAINER_EXITED:
            raise CallError(grpc.StatusCode.UNKNOWN, f"failed to update resources: {STOPPED}")
        for name in RESOURCE_FIELDS:
            value = getattr(res, name)
            if value:
                setattr(c.spec, name, value)
                if c.task:  # its cgroup too
                    setattr(c.resources, name, value)
        self.on_change()

    # -- what the simulator does to it ---------------------------------------------------------------
    def running(self) -> list[Ctr]:
        return [c for c in self.containers.values() if c.state == cri.CONTAINER_RUNNING]

    def _exit(self, c: Ctr) -> None:
        if c.state == cri.CONTAINER_RUNNING:
            c.exited_at = self.loop.time()
        c.state, c.task = cri.CONTAINER_EXITED, False

    def _listed_state(self, c: Ctr) -> int:
        """What a listing says: a container that stopped a moment ago still lists as running."""
        if c.state == cri.CONTAINER_EXITED and c.exited_at and \
                self.loop.time() - c.exited_at < self.quirks.list_lag:
            return cri.CONTAINER_RUNNING
        return c.state

    def _of(self, pod_id: str) -> list[Ctr]:
        return [c for c in self.containers.values() if c.pod_id == pod_id]

    def _get(self, cid: str) -> Ctr:
        c = self.containers.get(cid)
        if c is None:
            raise CallError(grpc.StatusCode.NOT_FOUND, f"container {cid} not found")
        return c

    def _id(self, kind: str) -> str:
        self._n += 1
        return f"{kind}{self._n:04d}{self.rng.getrandbits(32):08x}"

    def freeze(self, seconds: float) -> None:
        self.freeze_until = max(self.freeze_until, self.loop.time() + seconds)

    def restart(self, down: float) -> None:
        self.epoch += 1
        self.freeze_until = 0.0
        self.down_until = self.loop.time() + down

    async def _latency(self) -> None:
        if self.loop.time() < self.down_until:
            raise CallError(grpc.StatusCode.UNAVAILABLE, "connection refused: containerd is not running")
        epoch = self.epoch
        await asyncio.sleep(self.rng.uniform(*self.quirks.latency))
        while self.loop.time() < self.freeze_until and self.epoch == epoch:
            await asyncio.sleep(self.freeze_until - self.loop.time())
        if self.epoch != epoch:
            raise CallError(grpc.StatusCode.UNAVAILABLE, "error reading from server: EOF (containerd restarted)")


class Cpusets:
    """The containers' cgroup cpusets as cri-resmgr reads and writes them (controllers/cgroups.py's
    Cpusets), on the model: a container has a cgroup once its task runs."""

    def __init__(self, ctrd: Containerd) -> None:
        self.ctrd = ctrd

    def _task(self, container_id: str) -> Ctr | None:
        c = self.ctrd.containers.get(container_id)
        return c if c is not None and c.task else None

    def read(self, cgroup_parent: str, container_id: str) -> tuple[str, str] | None:
        c = self._task(container_id)
        return (c.resources.cpuset_cpus, c.resources.cpuset_mems) if c is not None else None

    def write(self, cgroup_parent: str, container_id: str, cpus: str, mems: str) -> str | None:
        c = self._task(container_id)
        if c is None:
            return None
        if cpus:
            c.resources.cpuset_cpus = cpus
        if mems:
            c.resources.cpuset_mems = mems
        self.ctrd.on_change()
        return f"{cgroup_parent}/{container_id}"


class Client:
    """The RuntimeClient's methods (resmgr/frontends/cri/runtime.py) on the simulated containerd."""

    def __init__(self, ctrd: Containerd) -> None:
        self.ctrd = ctrd
        self.dead = False  # the process that holds it was killed: its calls never reach containerd

    async def _enter(self) -> None:
        if self.dead:
            raise CallError(grpc.StatusCode.UNAVAILABLE, "the caller is gone")
        await self.ctrd._latency()
        if self.dead:
            raise CallError(grpc.StatusCode.UNAVAILABLE, "the caller is gone")

    async def version(self) -> cri.VersionResponse:
        await self._enter()
        return cri.VersionResponse(runtime_name="containerd", runtime_version="v2.3.7")

    async def list_pods(self) -> list[cri.PodSandbox]:
        await self._enter()
        return [cri.PodSandbox(id=s.id, metadata=s.config.metadata, state=s.state, labels=s.config.labels,
                               annotations=s.config.annotations) for s in self.ctrd.sandboxes.values()]

    async def pod_status(self, pod_id: str) -> cri.PodSandboxStatusResponse:
        await self._enter()
        sb = self.ctrd.sandboxes.get(pod_id)
        if sb is None:
            raise CallError(grpc.StatusCode.NOT_FOUND, f"sandbox {pod_id} not found")
        info = {"config": {"linux": {"cgroup_parent": sb.config.linux.cgroup_parent}}}
        return cri.PodSandboxStatusResponse(
            status=cri.PodSandboxStatus(id=pod_id, metadata=sb.config.metadata, state=sb.state,
                                        labels=sb.config.labels, annotations=sb.config.annotations),
            info={"info": json.dumps(info)})

    async def list_containers(self, pod_id: str = "") -> list[cri.Container]:
        await self._enter()
        return [cri.Container(id=c.id, pod_sandbox_id=c.pod_id, metadata=c.config.metadata,
                              state=self.ctrd._listed_state(c), labels=c.config.labels,
                              annotations=c.config.annotations)
                for c in self.ctrd.containers.values() if not pod_id or c.pod_id == pod_id]

    async def container_status(self, container_id: str, verbose: bool = True) -> cri.ContainerStatusResponse:
        await self._enter()
        c = self.ctrd._get(container_id)
        res = cri.LinuxContainerResources()
        res.CopyFrom(c.spec)
        status = cri.ContainerStatus(id=c.id, metadata=c.config.metadata, state=self.ctrd._listed_state(c),
                                     labels=c.config.labels, annotations=c.config.annotations,
                                     resources=cri.ContainerResources(linux=res))
        info = {"config": {"command": list(c.config.command), "args": list(c.config.args)}} if verbose else {}
        return cri.ContainerStatusResponse(status=status, info={"info": json.dumps(info)} if verbose else {})

    async def update_resources(self, container_id: str, res: cri.LinuxContainerResources) -> None:
        await self._enter()
        self.ctrd._update(container_id, res)

    def container_events(self) -> Any:
        raise CallError(grpc.StatusCode.UNIMPLEMENTED, "no event stream in the simulation")


def to_nri(res: cri.LinuxContainerResources) -> nri.LinuxResources:
    out = nri.LinuxResources()
    out.cpu.cpus, out.cpu.mems = res.cpuset_cpus, res.cpuset_mems
    if res.cpu_shares:
        out.cpu.shares.value = res.cpu_shares
    if res.cpu_quota:
        out.cpu.quota.value = res.cpu_quota
    if res.cpu_period:
        out.cpu.period.value = res.cpu_period
    if res.memory_limit_in_bytes:
        out.memory.limit.value = res.memory_limit_in_bytes
    return out


def to_cri(res: nri.LinuxResources) -> cri.LinuxContainerResources:
    """What an NRI update or adjustment sets (the fields it leaves out keep their values)."""
    return cri.LinuxContainerResources(cpuset_cpus=res.cpu.cpus, cpuset_mems=res.cpu.mems,
                                       cpu_shares=res.cpu.shares.value, cpu_quota=res.cpu.quota.value,
                                       cpu_period=res.cpu.period.value,
                                       memory_limit_in_bytes=res.memory.limit.value)


def merged(base: cri.LinuxContainerResources, over: cri.LinuxContainerResources) -> cri.LinuxContainerResources:
    out = cri.LinuxContainerResources()
    out.CopyFrom(base)
    for name in RESOURCE_FIELDS:
        if getattr(over, name):
            setattr(out, name, getattr(over, name))
    return out
