"""Starting a container: held back until the containers its grant moved are off its CPUs."""

from __future__ import annotations

import asyncio
import logging
import time

from resmgr.engine.reconcile import Reconciler
from resmgr.engine.state import Call, EngineState, NotReady, T
from resmgr.model import Container, ContainerState
from resmgr.topology.cpuset import CPUSet

log = logging.getLogger("cri-resmgr.engine")

START_WAIT = 10.0  # how long a start waits for the starts of containers moved off its CPUs
HOLD_BACK_MAX = 60.0  # how long starts are refused while the runtime does not take such moves


class Start:
    def __init__(self, state: EngineState, reconciler: Reconciler) -> None:
        self.state, self.reconciler = state, reconciler

    def starts_later(self, container_id: str) -> None:
        """The runtime is to start the container from what it reads when the start begins, which
        may be before an update sent from now lands (containerd under NRI): such an update is not
        taken until the container has started and it is sent again (start_container)."""
        self.state.pusher.starting.setdefault(container_id, asyncio.Event())

    async def start_container(self, container_id: str, call: Call[T], before: bool = True,
                              deadline: float | None = None) -> T:
        """Start a container through call(), once the containers its grant moved are off its CPUs.

        One we do not know was made behind our back (or by a create whose answer was lost): it is
        adopted first, so it never runs on CPUs that are someone else's. If the runtime has not
        taken the moves of the containers that must leave its CPUs (their updates failed, or were
        lost with a restart), they are pushed again until it does or the caller's deadline
        (monotonic) is near, and the start is refused (NotReady) while any is still not confirmed.
        before=False: the runtime has started it already (NRI).
        """
        if before:
            if container_id not in self.state.containers and self.state.reconciled.is_set():
                await self.reconciler.reconcile()
            repin = self.state.pusher.repins.get(container_id)
            if repin is not None:
                await asyncio.shield(repin)
            await self._clear_the_way(container_id, deadline)
            await self.off_its_cpus(container_id)
        starting = self.state.pusher.starting
        started = starting.setdefault(container_id, asyncio.Event())
        try:
            resp = await call()
        finally:
            if starting.get(container_id) is started:
                del starting[container_id]  # first: a push from now on reaches the task it made
            if container_id in self.state.pusher.raced:
                # Updated while the runtime was starting it: the runtime may have started it with
                # what it held before (its record says the new CPUs, its cgroup the old ones).
                await self.state.pusher.again(container_id)
            started.set()
        async with self.state.lock:
            c = self.state.containers.get(container_id)
            if c is not None:
                self.state.ledger.started(c)
        if c is not None:
            await self.state.controllers_apply(c)
            await self.state.save()
        return resp

    async def off_its_cpus(self, container_id: str) -> list[str]:
        """Just before the container runs: the containers whose cgroups still hold its CPUs, though
        the runtime took their moves off them (containerd ignores a failed update an NRI answer
        carries, and a lost task takes one without applying it), have their cgroups written now,
        and so does its own where it holds CPUs its grant does not. The ids written."""
        c = self.state.containers.get(container_id)
        if c is None or self.state.cpusets is None:
            return []
        async with self.state.lock:  # no grant changes while the cgroups are compared and written
            others = [self.state.containers[k] for k in self._elsewhere(c)]
            written = await self.reconciler.cgroups.clear(c, others)
            if await self.reconciler.cgroups.own(c):
                written.append(c.id)
            return written

    async def _clear_the_way(self, container_id: str, deadline: float | None) -> None:
        c = self.state.containers.get(container_id)
        if c is None:
            return
        await self._after_resizes(c)  # first: an undone resize moves containers (others, below)
        others = self._elsewhere(c)
        starting = [self.state.pusher.starting[k] for k in others if k in self.state.pusher.starting]
        if starting:  # the runtime is starting them; one updated meanwhile is updated again after
            waits = [asyncio.create_task(e.wait()) for e in starting]
            await asyncio.wait(waits, timeout=START_WAIT)
            for w in waits:
                w.cancel()
        blocking = await self.state.pusher.until_taken(others, deadline)
        if not blocking:
            self.state.held_back.pop(container_id, None)
            return
        since = self.state.held_back.setdefault(container_id, time.monotonic())
        names = ", ".join(k[:12] for k in blocking)
        if time.monotonic() - since < HOLD_BACK_MAX:
            raise NotReady(f"container {container_id} cannot start yet: the runtime has not taken the update "
                           f"moving container(s) {names} off its CPUs; try again")
        # A runtime that keeps refusing those updates must not keep the container from ever running.
        log.error("starting container %s although the runtime has refused for %.0f s to move container(s) %s "
                  "off its CPUs", container_id, time.monotonic() - since, names)
        self.state.held_back.pop(container_id, None)

    async def _after_resizes(self, c: Container) -> None:
        """Resizes under way give up CPUs the policy has given c, which they run on until the runtime
        takes them: wait for them (START_WAIT at most, then NotReady and kubelet starts it again)."""
        busy = await self.state.pusher.after_resizes(CPUSet.parse_or_empty(c.resources.cpuset_cpus), c.key,
                                                     START_WAIT)
        if busy:
            raise NotReady(f"container {c.id} cannot start yet: container(s) {', '.join(k[:12] for k in busy)} "
                           "still run on its CPUs, their resize under way; try again")

    def _elsewhere(self, c: Container) -> list[str]:
        """Other live containers given CPUs apart from c's: the runtime may still run one on c's CPUs
        while its update is not confirmed."""
        mine = CPUSet.parse_or_empty(c.resources.cpuset_cpus)
        if not mine:
            return []
        out = []
        for key, o in self.state.containers.items():
            if key == c.key or not o.id or o.state == ContainerState.EXITED:
                continue
            theirs = CPUSet.parse_or_empty(o.resources.cpuset_cpus)
            if theirs and theirs.isdisjoint(mine):
                out.append(key)
        return out
