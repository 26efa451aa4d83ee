"""NRI events translated into engine calls and runtime hook plugin calls.

The runtime has already decided to do what an event reports; the engine's lifecycle
calls get a no-op for the runtime call and the answer carries what the policy and the
hook plugins change: a ContainerAdjustment for the container being created, and
ContainerUpdates for containers the decision moved (collected while the handler runs,
see runtime.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.message import Message

from resmgr import metrics
from resmgr.engine import Engine
from resmgr.engine.calls import Calls, HookPoints
from resmgr.engine.create import CreatePlan
from resmgr.frontends import errors
from resmgr.frontends.nri import convert
from resmgr.frontends.nri.runtime import Collector, NriRuntime, Send, collecting
from resmgr.frontends.nri.transport import (
    FAILED_PRECONDITION,
    INVALID_ARGUMENT,
    UNIMPLEMENTED,
    Call,
    RpcError,
)
from resmgr.generated.nri import api_pb2 as nri
from resmgr.model import Adjustment, ContainerState, Pod, Resources
from resmgr.topology.cpuset import CPUSet

log = logging.getLogger("cri-resmgr.nri")
CODE_NAMES = {number: name for name, number in errors.CODES.items()}

SERVICE = "nri.pkg.api.v1alpha1.Plugin"
E = nri.Event
# Every event we act on. Runtimes before UPDATE_POD_SANDBOX existed refuse a mask with
# a bit above 0x7ff, so that one is asked for only where it is known to exist.
EVENTS = [E.RUN_POD_SANDBOX, E.STOP_POD_SANDBOX, E.REMOVE_POD_SANDBOX, E.CREATE_CONTAINER,
          E.START_CONTAINER, E.POST_START_CONTAINER, E.UPDATE_CONTAINER, E.POST_UPDATE_CONTAINER, E.STOP_CONTAINER,
          E.REMOVE_CONTAINER, E.UPDATE_POD_SANDBOX]
OLD_EVENTS_MASK = 0x7FF
MARGIN = 0.2  # seconds kept back from the runtime's deadline for our own answer
RESYNC_IDLE = 5.0  # seconds without an event before the plugin may register again to deliver updates
AFTER_UPDATE_WAIT = 5.0  # seconds the moves onto CPUs an updated container gives up wait for its PostUpdateContainer
# Events whose answer carries nothing, by the method newer runtimes deliver them with (older
# ones use StateChange): request, event, answer.
EVENT_METHODS = {
    "RunPodSandbox": (nri.RunPodSandboxRequest, E.RUN_POD_SANDBOX, nri.RunPodSandboxResponse),
    "StopPodSandbox": (nri.StopPodSandboxRequest, E.STOP_POD_SANDBOX, nri.StopPodSandboxResponse),
    "RemovePodSandbox": (nri.RemovePodSandboxRequest, E.REMOVE_POD_SANDBOX, nri.RemovePodSandboxResponse),
    "StartContainer": (nri.StartContainerRequest, E.START_CONTAINER, nri.StartContainerResponse),
    "PostStartContainer": (nri.PostStartContainerRequest, E.POST_START_CONTAINER, nri.PostStartContainerResponse),
    "PostUpdateContainer": (nri.PostUpdateContainerRequest, E.POST_UPDATE_CONTAINER, nri.PostUpdateContainerResponse),
    "RemoveContainer": (nri.RemoveContainerRequest, E.REMOVE_CONTAINER, nri.RemoveContainerResponse),
}


def unsafe_updates(runtime: str, version: str, nri_version: str) -> bool:
    """Whether the runtime's UpdateContainers can deadlock it against its own events: NRI before
    v0.12.1 takes its lock before the runtime's for UpdateContainers and after it for events
    (containerd before 2.4.0; containerd issue 13733). Unknown runtimes are taken as such."""
    nri_at = _version(nri_version)
    if nri_at is not None:
        return nri_at < (0, 12, 1)
    at = _version(version)
    return runtime != "containerd" or at is None or at < (2, 4, 0)


def _version(text: str) -> tuple[int, int, int] | None:
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def mask(events: list[int]) -> int:
    out = 0
    for e in events:
        out |= 1 << (e - 1)
    return out


async def _noop() -> None:
    """The runtime call of an engine lifecycle call: in NRI the runtime makes it itself."""


def knows_pod_updates(runtime: str, version: str, nri_version: str) -> bool:
    """Whether the runtime accepts UPDATE_POD_SANDBOX in the event mask."""
    if nri_version:
        return True  # runtimes that report their NRI version are newer than the event
    m = re.match(r"v?(\d+)\.(\d+)", version)
    if not m:
        return False
    major, minor = int(m.group(1)), int(m.group(2))
    return runtime == "containerd" and (major, minor) >= (2, 2)


class NriPlugin:
    def __init__(self, engine: Engine, runtime: NriRuntime, hooks: HookPoints | None = None) -> None:
        self.engine = engine
        self.runtime = runtime
        self.calls = Calls(engine, hooks)
        self.events = 0
        self.old_runtime = False  # set when a runtime dropped us right after a full event mask
        self.configured = False
        self.synchronized = False
        self.send: Send | None = None  # UpdateContainers on the current connection
        self.close: Callable[[], None] | None = None  # ends the current connection (None: it cannot be redialled)
        self.resyncing = False  # the connection was ended to synchronize again
        self.safe_updates = False  # the runtime's UpdateContainers cannot deadlock it
        self.in_flight = 0  # the runtime's calls being answered
        self.last_event = 0.0  # when the last one was answered (monotonic)
        self._after_update: dict[str, dict[str, Resources]] = {}  # by updated container: moves it must precede
        self._sync_pods: list[nri.PodSandbox] = []
        self._sync_containers: list[nri.Container] = []
        self._methods: dict[str, tuple[type[Message], Callable[[Any, float | None], Awaitable[Message]]]] = {
            "Configure": (nri.ConfigureRequest, self._configure),
            "Synchronize": (nri.SynchronizeRequest, self._synchronize),
            "Shutdown": (nri.Empty, self._shutdown),
            "StateChange": (nri.StateChangeEvent, self._state_change),
            "CreateContainer": (nri.CreateContainerRequest, self._create_container),
            "UpdateContainer": (nri.UpdateContainerRequest, self._update_container),
            "StopContainer": (nri.StopContainerRequest, self._stop_container),
            "UpdatePodSandbox": (nri.UpdatePodSandboxRequest, self._update_pod_sandbox),
        }
        for name, (request, event, answer) in EVENT_METHODS.items():
            self._methods[name] = (request, functools.partial(self._event_method, event, answer))

    def reset(self, send: Send | None, close: Callable[[], None] | None = None) -> None:
        """A new connection (None: it is gone): configuration and synchronization start over.
        close ends it, for a plugin that dials the runtime itself and so can synchronize again."""
        self.configured = self.synchronized = self.safe_updates = False
        self._sync_pods, self._sync_containers = [], []
        self.send, self.close = send, close
        self.runtime.resync = None
        if send is None:
            self.runtime.connected(None)

    def _resync(self) -> bool:
        """End the connection so that the runtime synchronizes again: only while no event has come for
        RESYNC_IDLE seconds, since that runtime can also deadlock when a plugin registers while its
        pods start and stop (its events hold off a registration, and a waiting one holds off events)."""
        if self.in_flight or self.close is None or not self.synchronized or \
                time.monotonic() - self.last_event < RESYNC_IDLE:
            return False
        self.resyncing = True
        self.close()
        return True

    async def handle(self, call: Call) -> bytes:
        entry = self._methods.get(call.method) if call.service == SERVICE else None
        if entry is None:
            log.warning("NRI runtime called unknown method %s.%s", call.service, call.method)
            raise RpcError(UNIMPLEMENTED, f"{call.service}.{call.method} is not implemented")
        cls, fn = entry
        req = cls.FromString(call.payload)
        deadline = call.deadline - MARGIN if call.deadline is not None else None
        started = time.perf_counter()
        event = _event_name(call.method, req)
        self.in_flight += 1
        try:
            resp = await fn(req, deadline)
        except RpcError as err:
            raise self._failed(event, started, err) from None
        except Exception as err:
            refused = errors.refusal(err)
            if refused is None:
                raise
            code, level = refused
            if level is not None:
                log.log(level, "NRI %s refused: %s", event, err)
            raise self._failed(event, started, RpcError(errors.CODES[code], str(err))) from None
        finally:
            self.in_flight -= 1
            self.last_event = time.monotonic()
        seconds = time.perf_counter() - started
        metrics.nri_event(event, "OK", seconds)
        log.debug("NRI %s answered in %.2f ms", event, seconds * 1000)
        return resp.SerializeToString()

    @staticmethod
    def _failed(event: str, started: float, err: RpcError) -> RpcError:
        metrics.nri_event(event, CODE_NAMES.get(err.code, "UNKNOWN"), time.perf_counter() - started)
        return err

    def _subscribed(self, event: int) -> None:
        if not self.events & (1 << (event - 1)):
            name = nri.Event.Name(event) if event in nri.Event.values() else str(event)
            log.warning("NRI runtime sent event %s, which this plugin did not subscribe to", name)
            raise RpcError(FAILED_PRECONDITION, f"not subscribed to event {name}")

    # -- set-up -----------------------------------------------------------------------------
    async def _configure(self, req: nri.ConfigureRequest, deadline: float | None) -> nri.ConfigureResponse:
        events = EVENTS
        if self.old_runtime or not knows_pod_updates(req.runtime_name, req.runtime_version, req.NRI_version):
            events = [e for e in EVENTS if mask([e]) <= OLD_EVENTS_MASK]
        self.events = mask(events)
        self.configured = True
        log.info("NRI: configured by %s %s%s (request timeout %d ms); events 0x%x", req.runtime_name,
                 req.runtime_version, f" (NRI {req.NRI_version})" if req.NRI_version else "",
                 req.request_timeout, self.events)
        self.safe_updates = not unsafe_updates(req.runtime_name, req.runtime_version, req.NRI_version)
        if not self.safe_updates:
            if self.close is not None:
                self.runtime.resync = self._resync
                log.info("NRI: %s %s can deadlock on UpdateContainers (containerd before 2.4.0); updates no "
                         "event answer carries are delivered by synchronizing again", req.runtime_name,
                         req.runtime_version)
            else:
                log.warning("NRI: %s %s can deadlock on UpdateContainers (containerd before 2.4.0) and this "
                            "plugin, started by the runtime, cannot synchronize again instead; consider "
                            "containerd 2.4.0 or later", req.runtime_name, req.runtime_version)
        return nri.ConfigureResponse(events=self.events)

    async def _synchronize(self, req: nri.SynchronizeRequest, deadline: float | None) -> nri.SynchronizeResponse:
        self._sync_pods.extend(req.pods)
        self._sync_containers.extend(req.containers)
        if req.more:
            return nri.SynchronizeResponse(more=True)
        started = time.perf_counter()
        self.runtime.replace(self._sync_pods, self._sync_containers)
        self.runtime.connected(self.send)  # the record is current again
        pods, ctrs = len(self._sync_pods), len(self._sync_containers)
        self._sync_pods, self._sync_containers = [], []
        with collecting() as collector:
            await self.engine.reconcile(limits=True)  # the runtime lists what it holds now
            await self.engine.state.settle_updates()
        self.synchronized = True
        if self.safe_updates and self.send is not None:
            # The runtime drops the updates of a Synchronize answer it fails to apply and tells no
            # one (containerd 2.4 too); UpdateContainers names the ones it refused, to be repaired.
            updated = self.runtime.queue(collector.updates)
            resp = nri.SynchronizeResponse()
        else:
            resp = nri.SynchronizeResponse(update=self._updates(collector))
            updated = len(resp.update)
            self.runtime.synchronized(updated)
        log.info("NRI: synchronized %d pods, %d containers in %.1f ms; %d container(s) updated", pods, ctrs,
                 (time.perf_counter() - started) * 1000, updated)
        return resp

    async def _shutdown(self, req: nri.Empty, deadline: float | None) -> nri.Empty:
        log.info("NRI: the runtime is shutting down")
        return nri.Empty()

    def _updates(self, collector: Collector, skip: str = "") -> list[nri.ContainerUpdate]:
        out = []
        if self.runtime.resync is not None:  # what waits to be delivered rides on this answer
            for cid, res in self.runtime.take_queued(skip).items():
                collector.updates.setdefault(cid, res)
        for cid, res in self.runtime.in_order(collector.updates, narrow=False):  # one update per container
            if cid == skip:
                continue
            known = self.runtime.containers.get(cid)
            base = convert.resources(known.linux.resources) if known is not None else None
            out.append(convert.update(cid, res, base))
            self.runtime.applied(cid, res)
        return out

    # -- events delivered one by one, or through StateChange ---------------------------------
    async def _state_change(self, req: nri.StateChangeEvent, deadline: float | None) -> nri.Empty:
        await self._on_event(req.event, req.pod, req.container, deadline)
        return nri.Empty()

    async def _event_method(self, event: int, answer: type[Message], req: Any, deadline: float | None) -> Message:
        await self._on_event(event, req.pod, getattr(req, "container", None), deadline)
        return answer()

    async def _on_event(self, event: int, pod: nri.PodSandbox, c: nri.Container | None,
                        deadline: float | None) -> None:
        self._subscribed(event)
        handler = self._events.get(event)
        if handler is None:
            raise RpcError(INVALID_ARGUMENT, f"event {event} cannot come as a state change")
        await handler(self, pod, c, deadline)

    async def _pod_run(self, p: nri.PodSandbox, _: Any, deadline: float | None) -> None:
        async def call(adj: Adjustment | None) -> tuple[None, Pod]:
            if adj:  # the sandbox exists already: only the record can take it
                log.info("pod %s/%s: runtime hook plugins' pod changes cannot be applied in NRI mode; recorded only",
                         pod.namespace, pod.name)
                pod.labels.update(adj.labels)
                pod.annotations.update(adj.annotations)
            self.runtime.seen_pod(p)
            return None, pod

        pod = convert.pod(p)
        await self.calls.run_pod(pod, call, deadline)

    async def _pod_stop(self, p: nri.PodSandbox, _: Any, deadline: float | None) -> None:
        async def call() -> None:
            for c in [c for c in self.runtime.containers.values() if c.pod_sandbox_id == p.id]:
                self.runtime.seen_container(c, nri.CONTAINER_STOPPED)

        await self.calls.stop_pod(p.id, call, deadline)

    async def _pod_remove(self, p: nri.PodSandbox, _: Any, deadline: float | None) -> None:
        await self.calls.remove_pod(p.id, _noop)
        self.runtime.gone_pod(p.id)

    async def _container_start(self, p: nri.PodSandbox, c: nri.Container, deadline: float | None) -> None:
        # The task is made, not yet started: the last moment to make sure nothing else runs on its CPUs.
        await self.engine.starting.off_its_cpus(c.id)
        # The start answer carries nothing: hook plugins' changes go with UpdateContainers.
        await self.calls.before_start(c.id, deadline)

    async def _container_started(self, p: nri.PodSandbox, c: nri.Container, deadline: float | None) -> None:
        self.runtime.seen_container(c, nri.CONTAINER_RUNNING)
        await self.calls.start_container(c.id, _noop, deadline, before=False)

    async def _container_remove(self, p: nri.PodSandbox, c: nri.Container, deadline: float | None) -> None:
        await self.calls.remove_container(c.id, _noop)
        self.runtime.gone_container(c.id)

    async def _container_stop(self, p: nri.PodSandbox, c: nri.Container, deadline: float | None) -> None:
        async def call() -> None:
            if c.id in self.runtime.containers:
                self.runtime.seen_container(c, nri.CONTAINER_STOPPED)

        await self.calls.stop_container(c.id, call, deadline)
        await self.engine.state.settle_updates()  # the CPUs it gave back: in the answer when it carries updates

    async def _container_updated(self, p: nri.PodSandbox, c: nri.Container, deadline: float | None) -> None:
        self._moves_after(c.id)

    def _moves_after(self, cid: str) -> None:
        """The moves onto CPUs cid gave up, now that the runtime has applied its update (or waited
        long enough for it)."""
        later = self._after_update.pop(cid, None)
        if later:
            self.runtime.queue(later)

    _events: dict[int, Callable[..., Awaitable[None]]] = {
        E.RUN_POD_SANDBOX: _pod_run, E.STOP_POD_SANDBOX: _pod_stop, E.REMOVE_POD_SANDBOX: _pod_remove,
        E.START_CONTAINER: _container_start, E.POST_START_CONTAINER: _container_started,
        E.POST_UPDATE_CONTAINER: _container_updated,
        E.REMOVE_CONTAINER: _container_remove, E.STOP_CONTAINER: _container_stop,
    }

    # -- events whose answer carries changes ---------------------------------------------------
    async def _create_container(self, req: nri.CreateContainerRequest, deadline: float | None) -> Message:
        self._subscribed(E.CREATE_CONTAINER)
        if req.pod.id not in self.runtime.pods:
            self.runtime.seen_pod(req.pod)
        c = convert.container(req.container)
        cid, c.id = c.id, ""
        c.state = ContainerState.PENDING  # being created, whatever state the runtime reports for it
        requested = c.requested

        async def call(plan: CreatePlan, adj: Adjustment | None) -> tuple[Adjustment | None, str]:
            # In the record before the engine knows its ID: a reconciliation round from then on
            # must find it there, or it drops the container and gives its CPUs away.
            self.runtime.seen_container(req.container, nri.CONTAINER_CREATED)
            return adj, cid  # the runtime makes it from our answer, which carries the adjustment

        with collecting() as collector:
            try:
                adj, created = await self.calls.create_container(convert.pod(req.pod), c, call, deadline=deadline)
            except BaseException:
                if cid not in self.engine.state.containers:
                    self.runtime.gone_container(cid)
                raise
            await self.engine.state.settle_updates()
        res = collector.updates.pop(cid, None) or created.resources
        self._clear_for(cid, res, collector)
        self.runtime.applied(cid, res)
        # containerd starts the task from the spec as it reads it when the start begins, which may
        # be before an update another event's answer carries for it lands in the spec.
        self.engine.starting.starts_later(cid)
        resp = nri.CreateContainerResponse(update=self._updates(collector, cid))
        sched = self.engine.state.scheduling_class(created.classes.get("sched", ""))
        resp.adjust.CopyFrom(convert.adjustment(res, requested, adj, sched=sched))
        return resp

    async def _update_container(self, req: nri.UpdateContainerRequest, deadline: float | None) -> Message:
        self._subscribed(E.UPDATE_CONTAINER)
        cid = req.container.id

        async def call(resources: Resources, adj: Adjustment | None) -> tuple[Resources, Resources]:
            sent = resources.overlaid(adj.resources if adj is not None else None)
            return sent, sent  # the runtime updates it from our answer

        async def unmanaged() -> None:
            return None

        with collecting() as collector:
            sent = await self.calls.update_container(cid, convert.resources(req.linux_resources), False, call,
                                                     unmanaged, lambda: None, deadline, clear=False)
            if sent is None:  # not a container we manage
                return nri.UpdateContainerResponse()
            await self.engine.state.settle_updates()
        final = collector.updates.pop(cid, None) or sent
        self._updated_answer(cid, final, collector)
        self.runtime.applied(cid, final)
        updates = [convert.update(cid, final)] + self._updates(collector, cid)
        return nri.UpdateContainerResponse(update=updates)

    def _updated_answer(self, cid: str, final: Resources, collector: Collector) -> None:
        """What an UpdateContainer answer carries beside the container's own update: as a create's,
        the moves of those the runtime still runs on the CPUs it takes (applied first); and the moves
        onto the CPUs it gives up, narrowed or held back until it has left them."""
        self._clear_for(cid, final, collector)
        self._defer_onto(cid, final, collector)

    def _clear_for(self, cid: str, res: Resources, collector: Collector) -> None:
        """A new container's answer also carries the update of each container the runtime still runs
        on CPUs given to it that it is to leave (an update the runtime has not taken: it was frozen,
        say, and the call failed): the runtime applies it before the new container can start. One
        whose move waits for CPUs others still run on only steps off the new one's."""
        cpus = CPUSet.parse_or_empty(res.cpuset_cpus)
        for oid, known in self.runtime.containers.items():
            c = self.engine.state.containers.get(oid)
            if oid == cid or oid in collector.updates or c is None or not c.resources.cpuset_cpus:
                continue
            runs_on, dest = CPUSet.parse_or_empty(known.linux.resources.cpu.cpus), CPUSet.parse(c.resources.cpuset_cpus)
            if not (runs_on - dest) & cpus or not c.state.live:
                continue
            blocked = self.engine.state.pusher.still_left(c.key) | self._left_by_others((oid, cid))
            if not dest & blocked:
                collector.updates[oid] = c.resources
                continue
            # Its move waits for CPUs others still run on: to where it may be now, or else only off
            # the new one's CPUs (the pusher sends the rest once they are free).
            step = (runs_on & dest) | (dest - blocked) or (runs_on - cpus)
            if step:
                collector.updates[oid] = dataclasses.replace(c.resources, cpuset_cpus=str(step))

    def _left_by_others(self, skip: tuple[str, ...]) -> CPUSet:
        """The CPUs live containers (but skip) run on, as the runtime's record has it, and are to leave."""
        out = CPUSet()
        for oid in self.runtime.containers:
            o = self.engine.state.containers.get(oid)
            if oid not in skip and o is not None and o.resources.cpuset_cpus and o.state.live:
                out |= self._runs_on(oid) - CPUSet.parse(o.resources.cpuset_cpus)
        return out

    def _runs_on(self, cid: str) -> CPUSet:
        known = self.runtime.containers.get(cid)
        return CPUSet.parse_or_empty(known.linux.resources.cpu.cpus) if known is not None else CPUSet()

    def _defer_onto(self, cid: str, final: Resources, collector: Collector) -> None:
        """The runtime applies the other containers' updates an UpdateContainer answer carries before
        the container's own: one that takes CPUs the container gives up (a resize that moves it, a
        swap) would share them with it until then. Such a move is split: the answer narrows it to
        what it may hold now, and the rest goes once the runtime reports the container updated. One
        with nothing else to go to (all its new CPUs given up by the container) is left where it
        runs until then, and so are the moves onto the CPUs it is to leave; unless the container
        takes those (a swap), which the answer carries as it is."""
        ends_on = CPUSet.parse_or_empty(final.cpuset_cpus)
        blocked = self._runs_on(cid) - ends_on if final.cpuset_cpus else CPUSet()
        later: dict[str, Resources] = {}
        swapping: set[str] = set()  # left in the answer: see below
        changed = True
        while changed:  # blocked only grows: each pass narrows or drops one at least, or ends
            changed = False
            for other, res in list(collector.updates.items()):
                cpus = CPUSet.parse_or_empty(res.cpuset_cpus)
                if other == cid or other in swapping or not cpus & blocked:
                    continue
                if now := cpus - blocked:
                    later.setdefault(other, res)
                    collector.updates[other] = dataclasses.replace(res, cpuset_cpus=str(now))
                elif self._runs_on(other) & ends_on:
                    # A swap with the container itself: no order spares a moment of both on some CPUs,
                    # and in the answer that moment is the runtime's one call, not a round trip.
                    swapping.add(other)
                    continue
                else:  # nothing it may hold yet: it stays where it runs, and what it is to leave waits too
                    final_of = later.setdefault(other, res)
                    del collector.updates[other]
                    blocked |= self._runs_on(other) - CPUSet.parse_or_empty(final_of.cpuset_cpus)
                changed = True
        if later:
            self._after_update.setdefault(cid, {}).update(later)
            asyncio.get_running_loop().call_later(AFTER_UPDATE_WAIT, self._moves_after, cid)

    async def _stop_container(self, req: nri.StopContainerRequest, deadline: float | None) -> Message:
        self._subscribed(E.STOP_CONTAINER)
        with collecting() as collector:
            await self._container_stop(req.pod, req.container, deadline)
        return nri.StopContainerResponse(update=self._updates(collector, req.container.id))

    async def _update_pod_sandbox(self, req: nri.UpdatePodSandboxRequest, deadline: float | None) -> Message:
        self._subscribed(E.UPDATE_POD_SANDBOX)
        self.runtime.seen_pod(req.pod)
        pod = self.engine.state.pods.get(req.pod.id)
        if pod is not None:  # the record only: what a pod's containers get is decided per container
            pod.overhead = convert.resources(req.overhead_linux_resources)
            pod.resources = convert.resources(req.linux_resources)
        return nri.UpdatePodSandboxResponse()


def _event_name(method: str, req: Message) -> str:
    """The metric label of a request: its method, or for StateChange the event it carries
    ('RUN_POD_SANDBOX' -> 'RunPodSandbox'), so both ways of delivering an event count alike."""
    if method != "StateChange" or not isinstance(req, nri.StateChangeEvent):
        return method
    name = nri.Event.Name(req.event) if req.event in nri.Event.values() else "Unknown"
    return "".join(part.capitalize() for part in name.split("_"))
