"""NRI events translated into engine calls and runtime hook plugin calls.

The runtime has already decided to do what an event reports; the engine's lifecycle
calls get a no-op for the runtime call and the answer carries what the policy and the
hook plugins change: a ContainerAdjustment for the container being created, and
ContainerUpdates for containers the decision moved (collected while the handler runs,
see runtime.py).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.message import Message

from policies.base import PolicyError
from resmgr.controllers import ControllerError
from resmgr.engine import Engine
from resmgr.engine.lifecycle import NotReady
from resmgr.generated.nri import api_pb2 as nri
from resmgr.hooks import HookFailed, Hooks
from resmgr.model import Adjustment, Resources
from resmgr.nri import convert
from resmgr.nri.runtime import COLLECTING, Collector, NriRuntime, Send
from resmgr.nri.transport import Call, RpcError

log = logging.getLogger("cri-resmgr.nri")

SERVICE = "nri.pkg.api.v1alpha1.Plugin"
E = nri.Event
# Every event we act on. Runtimes before UPDATE_POD_SANDBOX existed refuse a mask with
# a bit above 0x7ff, so that one is asked for only where it is known to exist.
EVENTS = [E.RUN_POD_SANDBOX, E.STOP_POD_SANDBOX, E.REMOVE_POD_SANDBOX, E.CREATE_CONTAINER,
          E.START_CONTAINER, E.POST_START_CONTAINER, E.UPDATE_CONTAINER, E.STOP_CONTAINER, E.REMOVE_CONTAINER,
          E.UPDATE_POD_SANDBOX]
OLD_EVENTS_MASK = 0x7FF
MARGIN = 0.2  # seconds kept back from the runtime's deadline for our own answer
CODES = {"FAILED_PRECONDITION": 9, "UNAVAILABLE": 14, "DEADLINE_EXCEEDED": 4, "INVALID_ARGUMENT": 3}


def mask(events: list[int]) -> int:
    out = 0
    for e in events:
        out |= 1 << (e - 1)
    return out


def _noop() -> Awaitable[None]:
    async def done() -> None:
        return None
    return done()


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
    def __init__(self, engine: Engine, runtime: NriRuntime, hooks: Hooks | None = None) -> None:
        self.engine = engine
        self.runtime = runtime
        self.hooks = hooks
        self.events = 0
        self.old_runtime = False  # set when a runtime dropped us right after a full event mask
        self.configured = False
        self.synchronized = False
        self.send: Send | None = None  # UpdateContainers on the current connection
        self._sync_pods: list[nri.PodSandbox] = []
        self._sync_containers: list[nri.Container] = []
        req = {"Configure": nri.ConfigureRequest, "Synchronize": nri.SynchronizeRequest,
               "Shutdown": nri.Empty, "StateChange": nri.StateChangeEvent,
               "CreateContainer": nri.CreateContainerRequest, "UpdateContainer": nri.UpdateContainerRequest,
               "StopContainer": nri.StopContainerRequest, "UpdatePodSandbox": nri.UpdatePodSandboxRequest,
               "RunPodSandbox": nri.RunPodSandboxRequest, "StopPodSandbox": nri.StopPodSandboxRequest,
               "RemovePodSandbox": nri.RemovePodSandboxRequest, "StartContainer": nri.StartContainerRequest,
               "PostStartContainer": nri.PostStartContainerRequest,
               "RemoveContainer": nri.RemoveContainerRequest}
        self._methods: dict[str, tuple[type[Message], Callable[[Any, float | None], Awaitable[Message]]]] = {
            name: (cls, getattr(self, "_" + re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()))
            for name, cls in req.items()}

    def reset(self, send: Send | None) -> None:
        """A new connection (None: it is gone): configuration and synchronization start over."""
        self.configured = self.synchronized = False
        self._sync_pods, self._sync_containers = [], []
        self.send = send
        if send is None:
            self.runtime.connected(None)

    async def handle(self, call: Call) -> bytes:
        entry = self._methods.get(call.method) if call.service == SERVICE else None
        if entry is None:
            log.warning("NRI runtime called unknown method %s.%s", call.service, call.method)
            raise RpcError(12, f"{call.service}.{call.method} is not implemented")
        cls, fn = entry
        req = cls.FromString(call.payload)
        deadline = call.deadline - MARGIN if call.deadline is not None else None
        started = time.perf_counter()
        try:
            resp = await fn(req, deadline)
        except (PolicyError, ControllerError) as err:
            raise RpcError(CODES["FAILED_PRECONDITION"], str(err)) from None
        except NotReady as err:
            raise RpcError(CODES["UNAVAILABLE"], str(err)) from None
        except HookFailed as err:
            raise RpcError(CODES.get(err.code, 2), str(err)) from None
        log.debug("NRI %s answered in %.2f ms", call.method, (time.perf_counter() - started) * 1000)
        return resp.SerializeToString()

    def _subscribed(self, event: int) -> None:
        if not self.events & (1 << (event - 1)):
            name = nri.Event.Name(event) if event in nri.Event.values() else str(event)
            log.warning("NRI runtime sent event %s, which this plugin did not subscribe to", name)
            raise RpcError(CODES["FAILED_PRECONDITION"], f"not subscribed to event {name}")

    # -- set-up -----------------------------------------------------------------------------
    async def _configure(self, req: nri.ConfigureRequest, deadline: float | None) -> nri.ConfigureResponse:
        events = EVENTS
        if self.old_runtime or not knows_pod_updates(req.runtime_name, req.runtime_version, req.NRI_version):
            events = [e for e in EVENTS if mask([e]) <= OLD_EVENTS_MASK]
        self.events = mask(events)
        self.configured = True
        log.info("NRI: configured by %s %s (request timeout %d ms); events 0x%x", req.runtime_name,
                 req.runtime_version, req.request_timeout, self.events)
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
        collector = Collector()
        COLLECTING.set(collector)
        try:
            await self.engine.reconcile()
            await self.engine.settle_updates()
        finally:
            collector.open = False
        self.synchronized = True
        resp = nri.SynchronizeResponse(update=self._updates(collector))
        log.info("NRI: synchronized %d pods, %d containers in %.1f ms; %d container(s) updated", pods, ctrs,
                 (time.perf_counter() - started) * 1000, len(resp.update))
        return resp

    async def _shutdown(self, req: nri.Empty, deadline: float | None) -> nri.Empty:
        log.info("NRI: the runtime is shutting down")
        return nri.Empty()

    def _updates(self, collector: Collector, skip: str = "") -> list[nri.ContainerUpdate]:
        out = []
        for cid, res in collector.updates.items():
            if cid == skip:
                continue
            known = self.runtime.containers.get(cid)
            base = convert.resources(known.linux.resources) if known is not None else None
            out.append(convert.update(cid, res, base))
            self.runtime.applied(cid, res)
        return out

    # -- events delivered one by one, or through StateChange ---------------------------------
    async def _state_change(self, req: nri.StateChangeEvent, deadline: float | None) -> nri.Empty:
        self._subscribed(req.event)
        handler = self._events.get(req.event)
        if handler is None:
            raise RpcError(CODES["INVALID_ARGUMENT"], f"event {req.event} cannot come as a state change")
        await handler(self, req.pod, req.container, deadline)
        return nri.Empty()

    async def _run_pod_sandbox(self, req: nri.RunPodSandboxRequest, deadline: float | None) -> Message:
        self._subscribed(E.RUN_POD_SANDBOX)
        await self._pod_run(req.pod, None, deadline)
        return nri.RunPodSandboxResponse()

    async def _stop_pod_sandbox(self, req: nri.StopPodSandboxRequest, deadline: float | None) -> Message:
        self._subscribed(E.STOP_POD_SANDBOX)
        await self._pod_stop(req.pod, None, deadline)
        return nri.StopPodSandboxResponse()

    async def _remove_pod_sandbox(self, req: nri.RemovePodSandboxRequest, deadline: float | None) -> Message:
        self._subscribed(E.REMOVE_POD_SANDBOX)
        await self._pod_remove(req.pod, None, deadline)
        return nri.RemovePodSandboxResponse()

    async def _start_container(self, req: nri.StartContainerRequest, deadline: float | None) -> Message:
        self._subscribed(E.START_CONTAINER)
        await self._container_start(req.pod, req.container, deadline)
        return nri.StartContainerResponse()

    async def _post_start_container(self, req: nri.PostStartContainerRequest, deadline: float | None) -> Message:
        self._subscribed(E.POST_START_CONTAINER)
        await self._container_started(req.pod, req.container, deadline)
        return nri.PostStartContainerResponse()

    async def _remove_container(self, req: nri.RemoveContainerRequest, deadline: float | None) -> Message:
        self._subscribed(E.REMOVE_CONTAINER)
        await self._container_remove(req.pod, req.container, deadline)
        return nri.RemoveContainerResponse()

    async def _pod_run(self, p: nri.PodSandbox, _: Any, deadline: float | None) -> None:
        pod = convert.pod(p)
        if self.hooks is not None:
            adj = await self.hooks.pre_run_pod(pod, deadline)
            if adj:  # the sandbox exists already: only the record can take it
                log.info("pod %s/%s: runtime hook plugins' pod changes cannot be applied in NRI mode; recorded only",
                         pod.namespace, pod.name)
                pod.labels.update(adj.labels)
                pod.annotations.update(adj.annotations)
        self.runtime.seen_pod(p)
        await self.engine.pod_created(pod)

    async def _pod_stop(self, p: nri.PodSandbox, _: Any, deadline: float | None) -> None:
        pod = self.engine.pods.get(p.id)
        await self.engine.stop_pod(p.id, _noop)
        for c in [c for c in self.runtime.containers.values() if c.pod_sandbox_id == p.id]:
            self.runtime.seen_container(c, nri.CONTAINER_STOPPED)
        if self.hooks is not None and pod is not None:
            await self.hooks.post_stop_pod(pod, deadline)

    async def _pod_remove(self, p: nri.PodSandbox, _: Any, deadline: float | None) -> None:
        await self.engine.remove_pod(p.id, _noop)
        self.runtime.gone_pod(p.id)

    async def _container_start(self, p: nri.PodSandbox, c: nri.Container, deadline: float | None) -> None:
        known = self.engine.context(c.id) if self.hooks is not None else None
        if self.hooks is None or known is None:
            return
        pod, model = known
        adj = await self.hooks.pre_start(pod, model, self.engine.pins(model), deadline)
        if adj.resources is not None:  # the start answer carries nothing: sent with UpdateContainers
            await self.engine.adjust(c.id, adj.resources)

    async def _container_started(self, p: nri.PodSandbox, c: nri.Container, deadline: float | None) -> None:
        self.runtime.seen_container(c, nri.CONTAINER_RUNNING)
        await self.engine.start_container(c.id, _noop)
        known = self.engine.context(c.id)
        if self.hooks is not None and known is not None:
            await self.hooks.post_start(*known, deadline)

    async def _container_remove(self, p: nri.PodSandbox, c: nri.Container, deadline: float | None) -> None:
        await self.engine.remove_container(c.id, _noop)
        self.runtime.gone_container(c.id)

    async def _container_stop_event(self, p: nri.PodSandbox, c: nri.Container, deadline: float | None) -> None:
        await self._container_stop(c, deadline, Collector(open=False))

    async def _container_stop(self, c: nri.Container, deadline: float | None, collector: Collector) -> None:
        known = self.engine.context(c.id)
        await self.engine.stop_container(c.id, _noop)
        await self.engine.settle_updates()
        collector.open = False
        if c.id in self.runtime.containers:
            self.runtime.seen_container(c, nri.CONTAINER_STOPPED)
        if self.hooks is not None and known is not None:
            await self.hooks.post_stop(*known, deadline)

    _events: dict[int, Callable[..., Awaitable[None]]] = {
        E.RUN_POD_SANDBOX: _pod_run, E.STOP_POD_SANDBOX: _pod_stop, E.REMOVE_POD_SANDBOX: _pod_remove,
        E.START_CONTAINER: _container_start, E.POST_START_CONTAINER: _container_started,
        E.REMOVE_CONTAINER: _container_remove, E.STOP_CONTAINER: _container_stop_event,
    }

    # -- events whose answer carries changes ---------------------------------------------------
    async def _create_container(self, req: nri.CreateContainerRequest, deadline: float | None) -> Message:
        self._subscribed(E.CREATE_CONTAINER)
        pod = convert.pod(req.pod)
        if req.pod.id not in self.runtime.pods:
            self.runtime.seen_pod(req.pod)
        c = convert.container(req.container)
        cid, c.id = c.id, ""
        requested = c.requested
        collector = Collector()
        COLLECTING.set(collector)
        adj: Adjustment | None = None
        try:
            plan = await self.engine.plan_create(pod, c)
            try:
                if self.hooks is not None:
                    adj = await self.hooks.pre_create(plan.pod, plan.container, plan.pinned, deadline)
                    if adj:
                        self.engine.amend_create(plan, adj)
            except BaseException as err:
                await self.engine.abort_create(plan, err, True)
                raise
            created = await self.engine.commit_create(plan, cid)
            await self.engine.settle_updates()
        finally:
            collector.open = False
        res = collector.updates.pop(cid, None) or created.resources
        self.runtime.seen_container(req.container, nri.CONTAINER_CREATED)
        self.runtime.applied(cid, res)
        resp = nri.CreateContainerResponse(update=self._updates(collector, cid))
        resp.adjust.CopyFrom(convert.adjustment(res, requested, adj))
        return resp

    async def _update_container(self, req: nri.UpdateContainerRequest, deadline: float | None) -> Message:
        self._subscribed(E.UPDATE_CONTAINER)
        cid = req.container.id
        asked = convert.resources(req.linux_resources)
        collector = Collector()
        COLLECTING.set(collector)
        try:
            plan = await self.engine.plan_update(cid, asked, False)
            if plan is None:
                return nri.UpdateContainerResponse()
            resources = plan.resources or plan.container.resources
            adjusted: Resources | None = None
            try:
                if self.hooks is not None:
                    adj = await self.hooks.pre_update(plan.pod, plan.container, plan.pinned, deadline)
                    adjusted = adj.resources
            except BaseException:
                await self.engine.abort_update(plan)
                raise
            sent = resources.overlaid(adjusted)
            await self.engine.commit_update(plan, sent, adjusted)
            await self.engine.settle_updates()
        finally:
            collector.open = False
        final = collector.updates.pop(cid, None) or sent
        self.runtime.applied(cid, final)
        updates = [convert.update(cid, final)] + self._updates(collector, cid)
        return nri.UpdateContainerResponse(update=updates)

    async def _stop_container(self, req: nri.StopContainerRequest, deadline: float | None) -> Message:
        self._subscribed(E.STOP_CONTAINER)
        collector = Collector()
        COLLECTING.set(collector)
        try:
            await self._container_stop(req.container, deadline, collector)
        finally:
            collector.open = False
        return nri.StopContainerResponse(update=self._updates(collector, req.container.id))

    async def _update_pod_sandbox(self, req: nri.UpdatePodSandboxRequest, deadline: float | None) -> Message:
        self._subscribed(E.UPDATE_POD_SANDBOX)
        self.runtime.seen_pod(req.pod)
        pod = self.engine.pods.get(req.pod.id)
        if pod is not None:  # the record only: what a pod's containers get is decided per container
            pod.overhead = convert.resources(req.overhead_linux_resources)
            pod.resources = convert.resources(req.linux_resources)
        return nri.UpdatePodSandboxResponse()
