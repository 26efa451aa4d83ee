"""One orchestration of every lifecycle call, for every front end.

Each call runs the same sequence whatever protocol it came in by: the engine plans,
runtime hook plugins see (and may change) the plan, the front end's runtime call is
made, then the engine commits, or aborts when anything failed. A front end passes its
runtime call as a coroutine function that writes the plan into its own request (the
relay's CRI message; nothing in NRI, where the runtime acts on the answer) and returns
the runtime's reply.

Whether a failure left the runtime untouched decides what the engine gives back: a
failure before the runtime call (a hook plugin, a cancellation) always did; after it,
the front end's `refused` predicate tells from the runtime's error.

Each call is a trace span (resmgr/telemetry.py; no-ops unless OpenTelemetry is on), with the
policy's decision, the hook plugins and the runtime call as its children.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, TypeVar

from resmgr.engine.create import CreatePlan
from resmgr.engine.engine import Engine
from resmgr.model import Adjustment, Container, Pod, Resources
from resmgr.tracing import tracer

T = TypeVar("T")


class HookPoints(Protocol):
    """The runtime hook plugins' points, in model terms (resmgr.hooks.Hooks)."""

    async def pre_run_pod(self, pod: Pod, deadline: float | None = None) -> Adjustment: ...

    async def post_stop_pod(self, pod: Pod, deadline: float | None = None) -> None: ...

    async def pre_create(self, pod: Pod, c: Container, pinned: bool, deadline: float | None = None) -> Adjustment: ...

    async def pre_start(self, pod: Pod, c: Container, pinned: bool, deadline: float | None = None) -> Adjustment: ...

    def wants_update(self, pod: Pod) -> bool: ...

    async def pre_update(self, pod: Pod, c: Container, pinned: bool, deadline: float | None = None) -> Adjustment: ...

    async def post_start(self, pod: Pod, c: Container, deadline: float | None = None) -> None: ...

    async def post_stop(self, pod: Pod, c: Container, deadline: float | None = None) -> None: ...


def _never(err: BaseException) -> bool:
    return False


class Calls:
    """The lifecycle calls of both front ends: engine decisions and hook plugins around the runtime call."""

    def __init__(self, engine: Engine, hooks: HookPoints | None = None) -> None:
        self.engine = engine
        self.hooks = hooks

    # -- pods ---------------------------------------------------------------------------
    async def run_pod(self, pod: Pod, call: Callable[[Adjustment | None], Awaitable[tuple[T, Pod]]],
                      deadline: float | None = None) -> T:
        """Hook plugins adjust the pod (call applies it where it can), the runtime makes it (call returns
        its reply and the pod as made), the engine records it."""
        with tracer.start_as_current_span("RunPodSandbox", attributes=_pod(pod)):
            adj = await self.hooks.pre_run_pod(pod, deadline) if self.hooks is not None else None
            resp, made = await call(adj or None)
            await self.engine.creating.pod_created(made)
            return resp

    async def stop_pod(self, pod_id: str, call: Callable[[], Awaitable[T]], deadline: float | None = None) -> T:
        with tracer.start_as_current_span("StopPodSandbox", attributes={"pod.id": pod_id}):
            pod = self.engine.state.pods.get(pod_id)
            resp = await self.engine.stopping.stop_pod(pod_id, call)
            if self.hooks is not None and pod is not None:
                await self.hooks.post_stop_pod(pod, deadline)
            return resp

    async def remove_pod(self, pod_id: str, call: Callable[[], Awaitable[T]]) -> T:
        with tracer.start_as_current_span("RemovePodSandbox", attributes={"pod.id": pod_id}):
            return await self.engine.stopping.remove_pod(pod_id, call)

    # -- containers ----------------------------------------------------------------------
    async def create_container(self, pod: Pod, c: Container,
                               call: Callable[[CreatePlan, Adjustment | None], Awaitable[tuple[T, str]]],
                               refused: Callable[[BaseException], bool] = _never, devices: Iterable[str] = (),
                               deadline: float | None = None) -> tuple[T, Container]:
        """Plan, hook plugins, the runtime call (returns its reply and the new container's ID), commit.

        PolicyError, ControllerError, NotReady: refused before anything changed.
        """
        with tracer.start_as_current_span("CreateContainer", attributes={**_pod(pod), "container.name": c.name}):
            with tracer.start_as_current_span("policy decision") as span:
                plan = await self.engine.creating.plan_create(pod, c, devices)
                if span.is_recording():
                    span.set_attributes(self._decision(plan.container, plan.decided, len(plan.updates)))
            adj = None
            try:
                if self.hooks is not None:
                    with tracer.start_as_current_span("hook plugins"):
                        adj = await self.hooks.pre_create(plan.pod, plan.container, plan.pinned, deadline)
                    if adj:
                        self.engine.creating.amend_create(plan, adj)
            except BaseException as err:
                await self.engine.creating.abort_create(plan, err, True)  # the runtime was not asked
                raise
            try:
                with tracer.start_as_current_span("runtime"):
                    resp, container_id = await call(plan, adj or None)
            except BaseException as err:
                await self.engine.creating.abort_create(plan, err, refused(err))
                raise
            return resp, await self.engine.creating.commit_create(plan, container_id)

    def _decision(self, c: Container, decided: bool, moved: int) -> dict[str, str | int | bool]:
        """What the policy decided for c, as span attributes."""
        grant = self.engine.state.policy.describe_grant(c.key) or {}
        return {"policy": self.engine.state.policy.name, "decided": decided, "cpuset.cpus": c.resources.cpuset_cpus,
                "cpuset.mems": c.resources.cpuset_mems, "pool": str(grant.get("pool", "")),
                "grant": str(grant.get("kind", "")), "exclusive": str(grant.get("exclusive", "")),
                "others.moved": moved}

    async def before_start(self, container_id: str, deadline: float | None = None) -> None:
        """Hook plugins' PreStartContainer: their resource changes are pushed to the runtime now."""
        known = self.engine.state.context(container_id) if self.hooks is not None else None
        if self.hooks is None or known is None:
            return
        pod, c = known
        adj = await self.hooks.pre_start(pod, c, self.engine.state.pins(c), deadline)
        if adj.resources is not None:
            await self.engine.updating.adjust(c.id, adj.resources)

    async def after_start(self, container_id: str, known: tuple[Pod, Container] | None,
                          deadline: float | None = None) -> None:
        if self.hooks is not None and known is not None:
            await self.hooks.post_start(*known, deadline)

    async def start_container(self, container_id: str, call: Callable[[], Awaitable[T]],
                              deadline: float | None = None, before: bool = True) -> T:
        """Start through call() (before=False: the runtime has started it already; its PreStart hook
        point came with an earlier event)."""
        with tracer.start_as_current_span("StartContainer", attributes={"container.id": container_id}):
            if before:
                await self.before_start(container_id, deadline)
            known = self.engine.state.context(container_id) if before else None
            resp = await self.engine.starting.start_container(container_id, call, before, deadline)
            await self.after_start(container_id, known or self.engine.state.context(container_id), deadline)
            return resp

    async def update_container(self, container_id: str, asked: Resources, plain: bool,
                               call: Callable[[Resources, Adjustment | None], Awaitable[tuple[T, Resources]]],
                               unmanaged: Callable[[], Awaitable[T]], unchanged: Callable[[], T],
                               deadline: float | None = None, clear: bool = True) -> T:
        """An update of a container's resources (see Engine.plan_update for asked and plain).

        call writes what to send (and the hook plugins' other changes) into the request, makes the runtime
        call, and returns the reply and the resources the runtime was sent. unmanaged: a container the
        engine does not manage, the request goes as it is; unchanged: the answer to one that changes nothing.
        clear: a resize waits until the containers it moves are off the CPUs it gains (False in NRI,
        where the runtime applies every update from our answer).
        """
        with tracer.start_as_current_span("UpdateContainerResources", attributes={"container.id": container_id}):
            with tracer.start_as_current_span("policy decision") as span:
                plan = await self.engine.updating.plan_update(container_id, asked, plain)
                if plan is not None and span.is_recording():
                    c = dataclasses.replace(plan.container, resources=plan.resources or plan.container.resources)
                    span.set_attributes(self._decision(c, plan.resources is not None, len(plan.moved)))
            if plan is None:
                return await unmanaged()
            hooked = self.hooks is not None and self.hooks.wants_update(plan.pod)
            if plan.resources is None and not hooked:
                return unchanged()
            resources = plan.resources or plan.container.resources
            try:
                if clear:
                    await self.engine.updating.clear_the_way(plan, deadline)
                adj = None
                if self.hooks is not None and hooked:
                    with tracer.start_as_current_span("hook plugins"):
                        c = dataclasses.replace(plan.container, resources=resources)
                        adj = await self.hooks.pre_update(plan.pod, c, plan.pinned, deadline)
                # Relay: after any push of it in flight. NRI (not clear): the answer carries it, and a
                # push waits for containerd's plugin lock, which the event being answered holds.
                sending = self.engine.state.pusher.sending(plan.container.key) if clear else contextlib.nullcontext()
                with tracer.start_as_current_span("runtime"):
                    async with sending:
                        resp, sent = await call(resources, adj)
            except BaseException:
                await self.engine.updating.abort_update(plan)
                raise
            await self.engine.updating.commit_update(plan, sent, adj.resources if adj is not None else None)
            return resp

    async def stop_container(self, container_id: str, call: Callable[[], Awaitable[T]],
                             deadline: float | None = None) -> T:
        with tracer.start_as_current_span("StopContainer", attributes={"container.id": container_id}):
            known = self.engine.state.context(container_id) if self.hooks is not None else None
            resp = await self.engine.stopping.stop_container(container_id, call)
            if self.hooks is not None and known is not None:
                await self.hooks.post_stop(*known, deadline)
            return resp

    async def remove_container(self, container_id: str, call: Callable[[], Awaitable[T]]) -> T:
        with tracer.start_as_current_span("RemoveContainer", attributes={"container.id": container_id}):
            return await self.engine.stopping.remove_container(container_id, call)


def _pod(pod: Pod) -> dict[str, str]:
    return {"pod.namespace": pod.namespace, "pod.name": pod.name, "pod.qos": pod.qos_class.value}
