"""Creating pods and containers: a container's create is planned (the policy decides where it
goes, unless another container holds its name), then aborted or committed by what the runtime did.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from resmgr.engine import life
from resmgr.engine.reconcile import SETTLE_GRACE, Reconciler
from resmgr.engine.state import EngineState, brief, failure
from resmgr.model import Adjustment, Container, ContainerState, Decision, Pod, Resources
from resmgr.policies.base import PolicyError
from resmgr.policies.toolkit import annotations

log = logging.getLogger("cri-resmgr.engine")


@dataclass
class CreatePlan:
    """A create decided by the engine and not yet made by the runtime."""

    pod: Pod
    container: Container  # its resources are what it must be created with
    decided: bool  # the policy set its resources (else the request stands as it is)
    updates: dict[str, Resources] = field(default_factory=dict)  # others moved, pushed once it exists
    pinned: bool = False  # the policy set its CPUs and memory nodes
    # The container we know to hold this name (pod, name, attempt), if any. The runtime decides: it
    # refuses the name while that one exists, and a container it makes anyway takes over its grant.
    holder: Container | None = None
    warm_after: float = 0.0  # a cold start: the policy warms it this long after it is made


class Create:
    def __init__(self, state: EngineState, reconciler: Reconciler) -> None:
        self.state, self.reconciler = state, reconciler

    async def pod_created(self, pod: Pod) -> None:
        """The runtime made a pod: record it.

        An older sandbox of the same pod UID stays until the runtime shows it gone (its stop,
        its removal or a reconciliation round): a new sandbox does not prove its containers ended.
        """
        async with self.state.lock:
            self.state.ledger.add_pod(pod)
        await self.state.save()

    async def plan_create(self, pod: Pod, c: Container, devices: Iterable[str] = ()) -> CreatePlan:
        """Decide where a new container goes (PolicyError, ControllerError: refused, nothing changed).

        pod is used if the engine does not know the pod yet (created while it was away).
        The front end creates the container with plan.container.resources, then calls
        commit_create or abort_create.
        """
        await self.state.until_reconciled()
        if c.key in self.state.ledger.unsettled:
            await self.reconciler.settle(c.pod_id)  # a retry: did the first attempt create it?
        await self._confirm_older(c)
        c.hints = self.state.device_hints(list(devices))  # sysfs reads: not under the lock
        async with self.state.lock:
            known = self.state.pods.get(c.pod_id)
            if known is None:
                known = self.state.ledger.add_pod(pod)
            pod = known
            self.state.controllers.check(c, pod)  # an annotation naming a class that does not exist
            holder = self._holder(c)
            if holder is not None:
                return self._successor_plan(pod, c, holder)
            with annotations.recording() as asked:
                alloc = self.state.ledger.place(c, pod)
            self.state.record(alloc.updates)
        unread = annotations.unread(c, pod, asked)
        if unread:  # said, not refused: the annotation may be meant for another policy
            log.warning("container %s/%s/%s: annotation(s) %s have no effect under policy %s", pod.namespace,
                        pod.name, c.name, ", ".join(unread), self.state.policy.name)
        decided = alloc.resources is not None
        return CreatePlan(pod, c, decided, alloc.updates, decided and self.state.policy.pins,
                          warm_after=alloc.warm_after)

    async def _confirm_older(self, c: Container) -> None:
        """Ask the runtime about older containers of c's name that we hold as live: a create asking for
        a name proves nothing about them.

        Those the runtime shows ended give back what they hold. An older attempt it shows created but
        never started is one kubelet gave up on (it makes the next attempt and never starts that one,
        as its CPU manager frees the CPUs of every container that is not running): it gives back its
        grant and waits on the shared CPUs. A running one keeps its grant.
        """
        older = [o for o in self.state.containers.values() if o.pod_id == c.pod_id and o.name == c.name and o.id
                 and o.state != ContainerState.EXITED]
        if not older:
            return
        start_seq = self.state.ledger.seq
        try:
            listed = {x.id: x for x in await self.state.runtime.list_containers(c.pod_id)}
        except Exception as err:  # unknown: they keep their grants, reconciliation finds out
            log.warning("cannot ask the runtime whether container(s) %s still run: %s",
                        ", ".join(o.id for o in older), brief(err))
            return
        async with self.state.lock:
            decision = Decision()
            for o in older:
                if self.state.containers.get(o.key) is not o or o.seq > start_seq:
                    continue  # changed meanwhile: what we heard may be older than that
                seen = listed.get(o.id)
                if seen is not None and seen.state == ContainerState.CREATED and o.attempt < c.attempt:
                    decision.updates.update(self._supersede(o))
                else:
                    decision.updates.update(self.reconciler.ended(o, seen).updates)
            self.state.record(decision.updates)
        await self.state.apply_updates(decision)

    def _supersede(self, o: Container) -> dict[str, Resources]:
        """An older attempt that will not be started gives back its grant (caller holds the lock)."""
        pod = self.state.pods.get(o.pod_id)
        if pod is None:
            return {}
        try:
            decision = self.state.ledger.demote(o, pod)
        except PolicyError as err:
            log.error("container %s holds nothing now and stays where it is (%s)", o.id, brief(err))
            self.state.ledger.await_grant(o.key)
            return {}
        self.state.ledger.granted(o.key)
        self.state.ledger.set_degraded(o.key, False)
        log.info("container %s (%s, attempt %d) was never started and a later attempt is made: its grant is "
                 "given back and it waits on the shared CPUs", o.id, o.name, o.attempt)
        return decision.updates

    def _holder(self, c: Container) -> Container | None:
        """The container we know to hold c's runtime name (same pod, name and attempt): one being
        created, or one the runtime made that has not ended."""
        for o in self.state.containers.values():
            if (o.pod_id, o.name, o.attempt) == (c.pod_id, c.name, c.attempt) and \
                    (not o.id or o.state != ContainerState.EXITED):
                return o
        return None

    def _successor_plan(self, pod: Pod, c: Container, holder: Container) -> CreatePlan:
        """A create of a name we know to be held: the runtime refuses it while the holder exists. It
        goes with the holder's grant, which a container the runtime makes anyway takes over."""
        log.info("create of %s in pod %s asks for the name held by %s; the runtime decides, and the "
                 "holder keeps its grant unless the runtime shows it gone", c.name, pod.id,
                 holder.id or "a create in flight")
        pinned = self.state.pins(holder)
        if pinned:
            c.resources = dataclasses.replace(holder.resources)
        c.classes = dict(holder.classes)
        return CreatePlan(pod, c, pinned, pinned=pinned, holder=holder)

    async def abort_create(self, plan: CreatePlan, err: BaseException, refused: bool) -> None:
        """The runtime call failed: refused (it certainly did nothing) gives the grant back;
        otherwise the grant stays until the runtime shows whether the container exists."""
        c = plan.container
        if plan.holder is not None:  # nothing was granted to it
            if not refused:
                self.state.wake()  # made or not: the runtime's listing tells
            return
        if refused:
            async with self.state.lock:
                undo = self.state.forget(c) if self.state.containers.get(c.key) is c else Decision()
                self.state.ledger.drop_deferred(c.key)
                self.state.record(undo.updates)
            await self.state.apply_updates(undo)
            return
        self.state.ledger.unsettle(c.key)
        log.warning("creating container %s in pod %s %s; its grant is kept until the runtime shows whether "
                    "the container exists", c.name, plan.pod.id, failure(err))
        self.state.wake()
        asyncio.get_running_loop().call_later(SETTLE_GRACE, self.state.wake)

    def amend_create(self, plan: CreatePlan, adj: Adjustment) -> None:
        """Hook plugins changed the planned create: it is made (and recorded) with their changes.

        Their resource fields stay laid over whatever the policy decides later. Atomic (no
        await), so it needs no lock.
        """
        c = plan.container
        c.annotations.update(adj.annotations)
        c.env.update(adj.env)
        c.adjusted = adj.resources
        c.resources = c.resources.overlaid(adj.resources)

    async def commit_create(self, plan: CreatePlan, container_id: str) -> Container:
        """The runtime made the container: it is known by its ID from now on."""
        c = plan.container
        if plan.holder is not None:
            return await self._commit_successor(plan, container_id)
        async with self.state.lock:
            made_on = c.resources.cpuset_cpus
            late = self.state.ledger.made(c, container_id)
            if late is not None:  # the policy moved it while the runtime was creating it
                c.resources, c.pending = late.overlaid(c.adjusted), True
                plan.updates[c.key] = c.resources
                self.state.pusher.created(c.key, made_on)  # it runs there until the move lands
        log.debug("container %s (%s, pod %s) created on cpus %s mems %s; %s", c.id, c.name, plan.pod.name,
                  c.resources.cpuset_cpus or "-", c.resources.cpuset_mems or "-", _moves(plan.updates))
        self.state.apply_soon(Decision(updates=plan.updates), before_start=c.key)
        if plan.warm_after:
            self.state.warm_later(c.key, plan.warm_after)
        await self.state.save()
        return c

    async def _commit_successor(self, plan: CreatePlan, container_id: str) -> Container:
        """The runtime made a container under a name we held for another: that one is gone (or its
        create never happened), so the new container takes over its grant."""
        c, holder = plan.container, plan.holder
        assert holder is not None
        async with self.state.lock:
            known = self.state.containers.get(container_id)
            if known is not None:  # a reconciliation round adopted it meanwhile
                return known
            life.named(c, container_id)
            if self.state.containers.get(holder.key) is holder and (
                    not holder.id or holder.state != ContainerState.EXITED):
                log.info("container %s takes over the grant of %s, which held its name", c.id,
                         holder.id or "a create that did not happen")
                late = self.state.ledger.take_over(holder, c)
                wanted = late or holder.resources
                updates = {c.key: wanted} if wanted.overlaid(c.adjusted) != c.resources else {}
                self.state.record(updates)
            else:  # the holder ended meanwhile: allocated like a container found running
                self.state.ledger.enter(c)
                self.state.ledger.await_grant(c.key)
                updates = self.reconciler.allocate_waiting()  # recorded as made
        self.state.apply_soon(Decision(updates=updates), before_start=c.key)
        await self.state.save()
        return c


def _moves(updates: dict[str, Resources]) -> str:
    """Who moves where, for the debug log."""
    if not updates:
        return "nobody moves"
    return "moves " + ", ".join(f"{k[:12]} to {r.cpuset_cpus or '-'}" for k, r in sorted(updates.items()))

