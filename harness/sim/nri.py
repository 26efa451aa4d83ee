"""containerd's NRI side on the simulated node: cri-resmgr as its plugin, the real NriPlugin and
NriRuntime (resmgr/frontends/nri/) called with the messages containerd sends, their answers applied
to the model as containerd applies them.

What it keeps of containerd's NRI adaptation (each a behaviour this project has met):
- a plugin registers, is configured and synchronized (the pods and containers containerd has, the
  answer's updates applied); until then, and after its connection closes, containerd makes and
  starts containers without it, on what kubelet asked (the window containerd issue 11217 names);
- each event waits for the plugin's answer at most the request timeout (2 s); a plugin that does
  not answer in time fails the create or start that asked, and stays registered;
- a create asks the plugin before containerd has the container: the answer's updates of other
  containers are applied, and one of a container containerd does not have yet is logged and
  ignored, as is one that fails;
- a start makes the task from the container's record, then asks the plugin (StartContainer), then
  runs it;
- an update's answer: the other containers' updates first, the container's own last, then
  PostUpdateContainer;
- UpdateContainers from the plugin: applied one by one, the ones that fail named in the answer;
  before containerd 2.4 it can deadlock, so the plugin synchronizes again instead (it closes the
  connection and dials again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import Message

from harness.sim.containerd import CallError, Ctr, to_cri, to_nri
from resmgr.frontends.nri.plugin import SERVICE, NriPlugin
from resmgr.frontends.nri.transport import Call, RpcError
from resmgr.generated.cri import api_pb2 as cri
from resmgr.generated.nri import api_pb2 as nri
from resmgr.topology.cpuset import CPUSet

if TYPE_CHECKING:
    from harness.sim.containerd import Containerd, Sandbox

REQUEST_TIMEOUT = 2.0  # containerd's plugin_request_timeout
REDIAL = 0.5  # the plugin's first backoff before it dials again
_STATES = {cri.CONTAINER_CREATED: nri.CONTAINER_CREATED, cri.CONTAINER_RUNNING: nri.CONTAINER_RUNNING,
           cri.CONTAINER_EXITED: nri.CONTAINER_STOPPED}


class Link:
    """One connection of the plugin: the daemon's life that holds it, and whether it is still open."""

    def __init__(self, plugin: NriPlugin, spawn: Callable[[Any], asyncio.Task[Any]]) -> None:
        self.plugin, self.spawn = plugin, spawn
        self.open = True
        self.synchronized = False


class Adaptation:
    def __init__(self, ctrd: Containerd, version: str, synchronized: Callable[[], None] = lambda: None) -> None:
        self.ctrd, self.version = ctrd, version
        self.synchronized = synchronized  # told after each synchronization (the simulator's invariants)
        self.note: Callable[[str], None] = lambda text: None  # the run's trace
        self.link: Link | None = None
        # containerd's NRI lock: one event at a time, its answer's updates of other containers applied
        # under it, and a plugin's UpdateContainers.
        self.lock = asyncio.Lock()

    # -- the plugin's connection ------------------------------------------------------------------------
    async def register(self, plugin: NriPlugin, spawn: Callable[[Any], asyncio.Task[Any]]) -> None:
        """The plugin dials, registers, is configured and synchronized; it dials again whenever the
        connection closes while its process lives."""
        while True:
            self.note("NRI: the plugin registers")
            if self.link is not None:
                self.link.open = False
            link = self.link = Link(plugin, spawn)  # a connection of its own: an old one's calls fail
            closed = asyncio.Event()

            async def send(updates: list[nri.ContainerUpdate], link: Link = link) -> list[nri.ContainerUpdate]:
                return await self._update_containers(link, updates)

            def close(link: Link = link, closed: asyncio.Event = closed) -> None:
                self._drop(link)
                closed.set()

            plugin.reset(send, close)
            try:
                await self._configure(link)
                await self._synchronize(link)
            except CallError:
                close()
            await closed.wait()
            plugin.reset(None)
            if plugin.resyncing:  # closed on purpose, to synchronize again: it dials at once
                plugin.resyncing = False
            else:
                await asyncio.sleep(REDIAL)

    def killed(self, plugin: NriPlugin) -> None:
        """The plugin's process is gone: its connection with it."""
        if self.link is not None and self.link.plugin is plugin:
            self._drop(self.link)

    def _drop(self, link: Link) -> None:
        link.open = False
        if self.link is link:
            self.link = None

    async def _configure(self, link: Link) -> None:
        req = nri.ConfigureRequest(runtime_name="containerd", runtime_version=self.version,
                                   request_timeout=int(REQUEST_TIMEOUT * 1000))
        await self._ask(link, "Configure", req, nri.ConfigureResponse)

    async def _synchronize(self, link: Link) -> None:
        pods = [self.pod(sb) for sb in self.ctrd.sandboxes.values()]
        ctrs = [self.container(c) for c in self.ctrd.containers.values() if c.pod_id in self.ctrd.sandboxes]
        async with self.lock:
            resp = await self._ask(link, "Synchronize", nri.SynchronizeRequest(pods=pods, containers=ctrs),
                                   nri.SynchronizeResponse, timeout=None)
            pairs = self.swaps(list(resp.update))
            self.ctrd.swapping |= pairs
            try:
                self.apply_all(resp.update, "Synchronize")
            finally:
                self.ctrd.swapping -= pairs
        link.synchronized = True
        self.synchronized()
        self.ctrd.on_change()

    async def _ask(self, link: Link, method: str, req: Message, answer: type[Message],
                   timeout: float | None = REQUEST_TIMEOUT) -> Any:
        """One call to the plugin; CallError as containerd reports a plugin's failure."""
        if not link.open:
            raise CallError(grpc.StatusCode.UNAVAILABLE, f"failed to handle {method} request: ttrpc: closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout is not None else None
        task = link.spawn(link.plugin.handle(Call(SERVICE, method, req.SerializeToString(), deadline)))
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:  # ttrpc gives up; the plugin's work goes on
            raise CallError(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"failed to handle {method} request: context deadline exceeded")
        if task.cancelled() or not link.open:
            raise CallError(grpc.StatusCode.UNAVAILABLE, f"failed to handle {method} request: ttrpc: closed")
        err = task.exception()
        if isinstance(err, RpcError):
            raise CallError(grpc.StatusCode.UNKNOWN, f"failed to handle {method} request: {err}")
        if err is not None:
            raise err  # a defect of the plugin's: the simulator reports it
        return answer.FromString(task.result())

    async def event(self, method: str, req: Message, answer: type[Message], why: str = "", but: str = "") -> Any:
        """An event for the registered plugin, if any (None: none registered or synchronized yet); the
        updates its answer carries (but but's: the caller applies the container's own) applied."""
        async with self.lock:
            link = self.link
            if link is None or not link.synchronized:
                return None
            resp = await self._ask(link, method, req, answer)
            updates = list(getattr(resp, "update", ()))
            pairs = self.swaps(updates)
            self.ctrd.swapping |= pairs
            try:
                self.apply_all((u for u in updates if u.container_id != but), why)
            finally:  # those with but's own update end once the caller has applied it
                self.ctrd.swapping -= {p for p in pairs if but not in p}
            return resp

    def swaps(self, updates: list[nri.ContainerUpdate]) -> set[frozenset[str]]:
        """The pairs of containers one answer swaps CPUs between: no order of its updates spares a
        moment of both on some CPUs, the moment of containerd's one call (the simulator's invariants
        excuse those pairs meanwhile, and nothing else)."""
        moves = {}
        for u in updates:
            c = self.ctrd.containers.get(u.container_id)
            if c is not None and u.linux.resources.cpu.cpus:
                moves[c.id] = (c.cpus, CPUSet.parse(u.linux.resources.cpu.cpus))
        return {frozenset((a, b)) for a, (a_now, a_new) in moves.items() for b, (b_now, b_new) in moves.items()
                if a < b and a_new & b_now and b_new & a_now}

    # -- containerd applying what the plugin answers ------------------------------------------------------
    async def _update_containers(self, link: Link, updates: list[nri.ContainerUpdate]) -> list[nri.ContainerUpdate]:
        """UpdateContainers: under the NRI lock from its arrival (so no event's answer is applied
        between), each applied in turn; those that fail are named."""
        async with self.lock:
            await self.ctrd._latency()
            if not link.open:
                raise ConnectionError("ttrpc: closed")
            return [u for u in updates if not self._apply(u, "UpdateContainers")]

    def apply_all(self, updates: Any, why: str) -> None:
        for u in updates:
            self._apply(u, why)  # a failure is logged and ignored

    def _apply(self, u: nri.ContainerUpdate, why: str = "") -> bool:
        c = self.ctrd.containers.get(u.container_id)
        if c is None or c.state == cri.CONTAINER_EXITED:
            self.note(f"containerd: NRI update of {u.container_id} ({why}) failed: "
                      f"{'not found' if c is None else 'stopped'}")
            return u.ignore_failure
        self.note(f"containerd: NRI update of {c.id} ({why}): cpus {u.linux.resources.cpu.cpus or '-'}")
        self.ctrd._update(c.id, to_cri(u.linux.resources))
        return True

    # -- the messages ---------------------------------------------------------------------------------
    def pod(self, sb: Sandbox) -> nri.PodSandbox:
        md = sb.config.metadata
        return nri.PodSandbox(id=sb.id, name=md.name, uid=md.uid, namespace=md.namespace,
                              labels=sb.config.labels, annotations=sb.config.annotations,
                              linux=nri.LinuxPodSandbox(cgroup_parent=sb.config.linux.cgroup_parent))

    def container(self, c: Ctr) -> nri.Container:
        annotations = dict(c.config.annotations)
        annotations["io.kubernetes.container.restartCount"] = str(c.config.metadata.attempt)
        return nri.Container(id=c.id, pod_sandbox_id=c.pod_id, name=c.config.metadata.name,
                             state=_STATES.get(c.state, nri.CONTAINER_UNKNOWN),
                             labels=c.config.labels, annotations=annotations,
                             linux=nri.LinuxContainer(resources=to_nri(c.spec)))

