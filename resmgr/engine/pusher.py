"""Pushing containers' desired resources to the runtime.

What a container should have is recorded in the ledger first (pending until the runtime
has taken it); a push sends whatever is desired at push time, so an older decision never
overwrites a newer one in the runtime. One push at a time per container, a bounded number
at once overall. A failed push is retried by reconciliation (it stays pending).

Pushes may run in the background so the call that caused them returns at once; a new
container's start waits for those that move others off its CPUs (`repins`). A container
updated while the runtime starts it is updated again once started (`raced`): the runtime
may have started it from what it held before.

Of many pushes at once (a policy switch, a rebalance), those that only take CPUs away go first:
a container moved onto CPUs another one still runs on would share them with it until both
pushes land, and on a busy runtime that is seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from resmgr.engine.ledger import Ledger
from resmgr.model import ContainerState, Resources
from resmgr.topology.cpuset import CPUSet

log = logging.getLogger("cri-resmgr.engine")

PARALLEL = 16  # runtime updates in flight at once


class Updater(Protocol):
    async def update_resources(self, container_id: str, res: Resources) -> None: ...


class Pusher:
    def __init__(self, ledger: Ledger, runtime: Updater, wake: Callable[[], None],
                 describe: Callable[[BaseException], str] = str) -> None:
        self.ledger = ledger
        self.runtime = runtime
        self.wake = wake  # a push failed: reconciliation retries it
        self.describe = describe
        self._locks: dict[str, asyncio.Lock] = {}
        self._slots = asyncio.Semaphore(PARALLEL)
        self._background: set[asyncio.Task[None]] = set()
        self.repins: dict[str, asyncio.Task[None]] = {}  # by container: the pushes its start waits for
        self.starting: dict[str, asyncio.Event] = {}  # containers the runtime is starting
        self.raced: set[str] = set()  # of those, the ones updated meanwhile
        self.held: dict[str, str] = {}  # by container: the CPUs the runtime holds, where known

    def note_held(self, updates: Mapping[str, Resources]) -> None:
        """Before updates are recorded: what the runtime holds of containers it has taken all of."""
        for key in updates:
            c = self.ledger.containers.get(key)
            if c is not None and c.id and not c.pending:
                self.held[key] = c.resources.cpuset_cpus

    def _gives_up_only(self, key: str) -> bool:
        c = self.ledger.containers.get(key)
        held = self.held.get(key)
        if c is None or held is None or not c.resources.cpuset_cpus:
            return False
        return CPUSet.parse(c.resources.cpuset_cpus) <= CPUSet.parse(held)

    async def push(self, key: str) -> None:
        lock = self._locks.setdefault(key, asyncio.Lock())
        containers = self.ledger.containers
        async with self._slots, lock:
            c = containers.get(key)
            if c is None or not c.id or not c.pending:
                return  # gone, or an earlier push already sent the latest
            res = c.resources
            starting = key in self.starting  # the runtime may start it from what it held before
            try:
                await self.runtime.update_resources(c.id, res)
            except Exception as err:
                log.error("updating resources of container %s failed (will retry): %s", c.id, self.describe(err))
                self.wake()
                return
            if starting or key in self.starting:
                self.raced.add(key)
            self.held[key] = res.cpuset_cpus
            if c.resources is res:
                c.pending = False
        if not lock.locked() and key not in containers:
            self._locks.pop(key, None)

    async def push_all(self, keys: Iterable[str]) -> None:
        containers = self.ledger.containers
        keys = [k for k in keys if (c := containers.get(k)) is not None and c.id]
        for gone in [k for k in self.held if k not in containers]:  # dropped with their pods
            del self.held[gone]
        first: list[str] = []
        rest: list[str] = []
        for k in keys:
            (first if self._gives_up_only(k) else rest).append(k)
        for wave in (first, rest):
            if wave:
                await asyncio.gather(*(self.push(k) for k in wave))

    async def push_pending(self) -> None:
        await self.push_all([k for k, c in self.ledger.containers.items() if c.pending and c.id])

    def soon(self, updates: Mapping[str, Resources], before_start: str = "") -> None:
        """Push updates in the background. The container before_start is not started until they are
        done: a new exclusive grant must not run while shared containers still run on its CPUs."""
        if not updates:
            return
        task = asyncio.create_task(self.push_all(list(updates)))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        if before_start:
            self.repins[before_start] = task
            task.add_done_callback(lambda t: self.repins.pop(before_start, None)
                                   if self.repins.get(before_start) is t else None)

    async def settle(self) -> None:
        """Wait for the pushes running in the background (at shutdown, in tests, for NRI answers)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def again(self, key: str) -> None:
        """Push a container's resources again (the runtime may have started it with older ones)."""
        self.raced.discard(key)
        c = self.ledger.containers.get(key)
        if c is not None and c.id and c.state != ContainerState.EXITED:
            c.pending = True
            await self.push(key)

    def forget(self, key: str) -> None:
        self.raced.discard(key)
        self.held.pop(key, None)
