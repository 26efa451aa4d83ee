"""Updating a container's resources: kubelet's updates and in-place resizes, and the hook
plugins' changes to a created container."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

from resmgr.engine.state import RESIZE_WAIT, EngineState, NotReady, brief
from resmgr.model import Container, ContainerState, Decision, Pod, Resources, overlay
from resmgr.topology.cpuset import CPUSet

log = logging.getLogger("cri-resmgr.engine")


@dataclass
class UpdatePlan:
    """An update of a container's resources decided by the engine, not yet taken by the runtime."""

    container: Container
    pod: Pod
    before: Resources  # what was requested until now
    requested: Resources
    resize: bool
    resources: Resources | None  # what to send; None: it changes nothing, answer without the runtime
    moved: dict[str, Resources] = field(default_factory=dict)
    pinned: bool = False  # the policy set its CPUs and memory nodes
    adjusted: Resources | None = None  # hook plugins' earlier changes that still stand


class Update:
    def __init__(self, state: EngineState) -> None:
        self.state = state

    async def adjust(self, container_id: str, res: Resources) -> None:
        """Hook plugins changed a created container's resources: push them to the runtime now."""
        async with self.state.lock:
            c = self.state.containers.get(container_id)
            if c is None or c.state == ContainerState.EXITED:
                return
            c.adjusted = overlay(c.adjusted, res)
            self.state.record({c.key: c.resources})
        await self.state.pusher.push(c.key)

    async def plan_update(self, container_id: str, asked: Resources, plain: bool) -> UpdatePlan | None:
        """kubelet's updates: an in-place resize re-allocates; the CPU manager's cpusets never win.

        asked holds the fields the caller names (zero: keep the value; kubelet's CPU manager
        sends a cpuset alone); plain: the call carries nothing the model does not hold, so
        one that changes nothing can be answered without the runtime (plan.resources None).
        None: not a container the engine manages; the call goes to the runtime as it is.
        PolicyError: a resize that cannot be met; nothing changed. One resize at a time: each
        decides from the node as the others left it (NotReady after RESIZE_WAIT).
        """
        await self.state.until_reconciled()
        end = time.monotonic() + RESIZE_WAIT
        while True:
            async with self.state.lock:
                plan = self._plan(container_id, asked, plain)
            if not isinstance(plan, list):
                return plan
            left = end - time.monotonic()
            if left <= 0 or await self.state.pusher.after_resizes(None, container_id, left):
                raise NotReady(f"the resize of container {container_id} waits for the resize of container(s) "
                               f"{', '.join(k[:12] for k in plan)}; try again")

    def _plan(self, container_id: str, asked: Resources, plain: bool) -> UpdatePlan | None | list[str]:
        """plan_update's decision (caller holds the lock); a list: the resizes under way it waits for."""
        c = self.state.containers.get(container_id)
        pod = self.state.pods.get(c.pod_id) if c is not None else None
        if c is None or pod is None or c.state == ContainerState.EXITED:
            return None
        before = c.requested
        requested = before.merged(asked)
        resize = requested.cpu() != before.cpu() or \
            requested.memory_limit_in_bytes != before.memory_limit_in_bytes
        if resize:
            if busy := [k for k in self.state.pusher.resizing if k != c.key]:
                return busy
            self.state.kept_before_resize()
            decision = self.state.policy.resize(c, pod, requested, self.state.view())
        else:
            decision = self.state.policy.update(c, requested, self.state.view())
        kept = c.adjusted.without(before.differing(requested)) if c.adjusted else None  # kubelet's word wins
        wanted = (decision.resources or requested).overlaid(kept)
        if not resize and plain and self._changes_nothing(asked, c, wanted):
            log.debug("update of container %s changes nothing; answered without the runtime", c.id)
            return UpdatePlan(c, pod, before, requested, resize, None, pinned=self.state.pins(c), adjusted=kept)
        self.state.record(decision.updates)  # pushed to the runtime once it took this one
        if resize and decision.resources is not None:
            # Until then nobody (reconciliation, another call's pushes) moves them onto the CPUs
            # this one gives up and still runs on.
            pusher = self.state.pusher
            pusher.resizing[c.key] = CPUSet.parse_or_empty(
                pusher.held.get(c.key, c.resources.cpuset_cpus)) - CPUSet.parse_or_empty(wanted.cpuset_cpus)
        return UpdatePlan(c, pod, before, requested, resize, wanted, decision.updates,
                          decision.resources is not None and self.state.pins(c), kept)

    @staticmethod
    def _changes_nothing(asked: Resources, c: Container, wanted: Resources) -> bool:
        """Whether asking for asked would leave the container as the runtime already holds it:
        what we recorded is confirmed (not pending) and every field asked names equals it."""
        if c.pending or wanted != c.resources:
            return False
        asked = dataclasses.replace(asked, cpuset_cpus=c.resources.cpuset_cpus,
                                    cpuset_mems=c.resources.cpuset_mems)
        return c.resources.merged(asked) == c.resources

    async def clear_the_way(self, plan: UpdatePlan, deadline: float | None) -> None:
        """Before a resize goes to the runtime: the containers it moves off the CPUs it gains have
        left them, their pushes taken (else NotReady, and kubelet asks for the resize again).

        A resize that only gives CPUs up, or moves nobody, goes at once; the others it moves follow
        (commit_update)."""
        if not plan.resize or plan.resources is None:
            return
        c = plan.container
        pusher = self.state.pusher
        gained = CPUSet.parse_or_empty(plan.resources.cpuset_cpus) - \
            CPUSet.parse_or_empty(pusher.held.get(c.key, c.resources.cpuset_cpus))
        if not gained:
            return
        busy = await pusher.after_resizes(gained, c.key, RESIZE_WAIT)
        if busy:  # another resize under way gives them up and still runs there
            raise NotReady(f"the resize of container {c.id} waits for the resize of container(s) "
                           f"{', '.join(k[:12] for k in busy)} off CPUs {gained}; try again")
        # The CPUs it gives up: a container that moves onto them must wait for this update (commit_update).
        given_up = CPUSet.parse_or_empty(pusher.held.get(c.key, c.resources.cpuset_cpus)) - \
            CPUSet.parse_or_empty(plan.resources.cpuset_cpus)
        leaving, left = [], []
        # The containers it moves, and those an earlier decision moves off the CPUs it gains (pending).
        others = list(plan.moved) + [k for k, o in self.state.containers.items() if k != c.key and o.pending
                                     and k not in plan.moved and CPUSet.parse_or_empty(pusher.held.get(k, "")) & gained]
        # One the runtime is creating runs, once made, where it was decided before (maybe on CPUs
        # this gains), until its move lands: known only once the create answers.
        creating = [k for k in others if k != c.key and (o := self.state.containers.get(k)) is not None and not o.id]
        if creating:
            raise NotReady(f"the resize of container {c.id} waits for the runtime to create container(s) "
                           f"{', '.join(k for k in creating)}; try again")
        for key in others:
            o = self.state.containers.get(key)
            if key == c.key or o is None or CPUSet.parse_or_empty(o.resources.cpuset_cpus) & gained:
                continue
            held = pusher.held.get(key)
            if held is None or CPUSet.parse_or_empty(held) & gained:  # unknown: it may run there
                if CPUSet.parse_or_empty(o.resources.cpuset_cpus) & given_up:  # a swap: aside first
                    if not await pusher.step_aside(key, given_up):
                        left.append(key)
                else:
                    leaving.append(key)
        left += await pusher.until_taken(leaving, deadline)
        if left:
            raise NotReady(f"the resize of container {c.id} waits for the runtime to move container(s) "
                           f"{', '.join(k[:12] for k in left)} off CPUs {gained}; try again")

    async def abort_update(self, plan: UpdatePlan) -> None:
        """The runtime refused (or may not have taken) the update: a resize is undone."""
        if plan.resize:
            await self._undo_resize(plan.container, plan.pod, plan.before, plan.requested)
        else:
            self.state.pusher.resizing.pop(plan.container.key, None)

    async def commit_update(self, plan: UpdatePlan, sent: Resources, adjusted: Resources | None = None) -> None:
        """The runtime took sent for the container (adjusted: the fields hook plugins changed in it)."""
        c = plan.container
        self.state.pusher.resizing.pop(c.key, None)  # the moves onto the CPUs it gave up may go now
        if sent.cpuset_cpus:
            self.state.pusher.took(c.key, sent.cpuset_cpus)
        async with self.state.lock:
            c.requested = plan.requested
            c.adjusted = overlay(plan.adjusted, adjusted)
            # Ask again: another decision may have moved this container meanwhile.
            now = self.state.policy.update(c, plan.requested, self.state.view())
            c.resources = now.resources.overlaid(c.adjusted) if now.resources else sent
            c.pending = c.resources != sent and c.state != ContainerState.EXITED
            self.state.ledger.apply(c, Decision(classes=now.classes))
            updates = dict(plan.moved)
            if c.pending:
                updates[c.key] = c.resources
        if plan.resize:
            log.info("container %s resized: cpu shares/quota/period %s, memory %d, cpus %s; %d other(s) moved",
                     c.id, "/".join(map(str, plan.requested.cpu())), plan.requested.memory_limit_in_bytes,
                     c.resources.cpuset_cpus or "any", len(plan.moved))
        await self.state.apply_updates(Decision(updates=updates))
        await self.state.controllers_apply(c)
        await self.state.save()

    async def _undo_resize(self, c: Container, pod: Pod, before: Resources, asked: Resources) -> None:
        """Place the container as it was asked before; where it no longer fits (its CPUs went to a
        container made meanwhile), it keeps the place its resize (asked) was given, at its old size."""
        async with self.state.lock:
            # Under way until the undo is recorded (no await between): a start or a push sees its moves.
            self.state.pusher.resizing.pop(c.key, None)
            try:
                undo = self.state.policy.resize(c, pod, before, self.state.view())
            except Exception as err:
                log.error("undoing the resize of container %s failed: %s; it moves where the resize put it",
                          c.id, brief(err))
                undo = self.state.policy.update(c, asked, self.state.view())
            if undo.resources is not None:
                self.state.pusher.note_held({c.key: c.resources})  # it runs there until the undo lands
                c.resources, c.pending = undo.resources.overlaid(c.adjusted), True
                undo.updates[c.key] = c.resources
            self.state.record(undo.updates)
        self.state.wake()
        await self.state.save()  # whole again: what the resize under way kept from the disk goes there
        await self.state.apply_updates(undo)
