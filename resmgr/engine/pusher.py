"""Pushing containers' desired resources to the runtime.

What a container should have is recorded in the ledger first (pending until the runtime
has taken it); a push sends whatever is desired at push time, so an older decision never
overwrites a newer one in the runtime. One push at a time per container, a bounded number
at once overall. A failed push is retried by reconciliation (it stays pending).

Pushes may run in the background so the call that caused them returns at once; a new
container's start waits for those that move others off its CPUs (`repins`). A container
updated while the runtime starts it (a push, a step aside, a narrowing) is updated again once
started (`raced`): the runtime may have started it from what it held before, so until then its
move is not taken. A step aside or a narrowing is decided once the container's lock is held:
one queued behind the push that landed its move would otherwise move it back.

Of many pushes at once (a policy switch, a rebalance), those that only take CPUs away go first:
a container moved onto CPUs another one still runs on would share them with it until both
pushes land, and on a busy runtime that is seconds. Where each waits for another (a swap, which
policy switches make), each first runs on only the CPUs it keeps, then they move. One moved onto
CPUs whose container the runtime did not take off them waits (pending) until reconciliation
pushes both again. A resize waits for the moves off the CPUs it gains before it goes to the
runtime (update.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Protocol

from resmgr.engine.ledger import Ledger
from resmgr.engine.moves import aside, movable
from resmgr.model import ContainerState, Resources, Stopped
from resmgr.topology.cpuset import CPUSet

log = logging.getLogger("cri-resmgr.engine")

PARALLEL = 16  # runtime updates in flight at once
# A call waiting for moves is answered this long before the caller's deadline, so a refusal
# reaches it: kubelet makes a refused container anew, which the user sees as a restart.
ANSWER_MARGIN = 5.0
RETRY_FIRST, RETRY_MAX = 0.2, 2.0  # waits between pushes of moves a call waits for


class Updater(Protocol):
    async def update_resources(self, container_id: str, res: Resources) -> None: ...


class Pusher:
    def __init__(self, ledger: Ledger, runtime: Updater, wake: Callable[[], None],
                 describe: Callable[[BaseException], str] = str,
                 shares: Callable[[str], bool] = lambda key: False) -> None:
        self.ledger = ledger
        self.runtime = runtime
        self.wake = wake  # a push failed: reconciliation retries it (with backoff: engine/retry.py)
        self.describe = describe
        self.shares = shares  # Policy.shares_freely: may run a moment on CPUs another such leaves
        self._locks: dict[str, asyncio.Lock] = {}
        self._slots = asyncio.Semaphore(PARALLEL)
        self._background: set[asyncio.Task[None]] = set()
        self.repins: dict[str, asyncio.Task[None]] = {}  # by container: the pushes its start waits for
        self.starting: dict[str, asyncio.Event] = {}  # containers the runtime is starting
        self.raced: set[str] = set()  # of those, the ones updated meanwhile
        self.held: dict[str, str] = {}  # by container: the CPUs the runtime holds, where known
        # Set once a reconciliation has looked at where containers run: before, what a restart
        # restored may be older than the node (a state write lost with the kill), so nothing moves.
        self.looked = asyncio.Event()
        self.looked.set()
        self.unmoved: set[str] = set()  # adopted, no move landed yet: held is where they were found
        self.removing: Counter[str] = Counter()  # pods and containers whose removal is under way
        # By container: the CPUs a resize under way gives up, which it runs on until the runtime has
        # taken it; the moves onto them its decision recorded wait for that (update.py).
        self.resizing: dict[str, CPUSet] = {}
        self.landed: dict[str, float] = {}  # by container: when an update of it last reached the runtime

    @contextlib.asynccontextmanager
    async def holding_off(self, ids: Iterable[str]) -> AsyncIterator[None]:
        """Nothing is sent to these pods' and containers' containers meanwhile, and pushes to them in
        flight end first: their removal is under way, and an update racing with a removal makes
        containerd 2.3 panic. What stays pending is pushed by reconciliation if they stay."""
        ids = list(ids)
        self.removing.update(ids)
        try:
            for c in list(self.ledger.containers.values()):
                lock = self._locks.get(c.key)
                if lock is not None and self._removed(c.id, c.pod_id):
                    async with lock:
                        pass
            yield
        finally:
            self.removing.subtract(ids)
            self.removing += Counter()  # drops the zeros

    def _removed(self, cid: str, pod_id: str) -> bool:
        return self.removing[cid] > 0 or self.removing[pod_id] > 0

    def note_held(self, updates: Mapping[str, Resources]) -> None:
        """Before updates are recorded: what the runtime holds of containers it has taken all of."""
        for key in updates:
            c = self.ledger.containers.get(key)
            if c is not None and c.id and not c.pending and key not in self.unmoved:
                self.held[key] = c.resources.cpuset_cpus

    def observed(self, key: str, seen: list[str], since: float) -> None:
        """Reconciliation saw the container run on seen (each source's CPUs, read after since): what
        the runtime holds, where no push of it is under way or landed since (a restart forgets what
        earlier pushes told)."""
        lock = self._locks.get(key)
        cpus = _union(seen)
        if cpus and (lock is None or not lock.locked()) and self.landed.get(key, -1.0) < since:
            self.held[key] = str(cpus)

    def seen_pending(self, key: str, seen: list[str]) -> None:
        """Reconciliation saw a container whose move has not landed run on seen, where nothing is
        known of what the runtime holds of it (a restart forgot): it holds those until a push of it
        lands (a push of the last life died with its connection, which cancels it in the runtime)."""
        if key not in self.held and (cpus := _union(seen)):
            self.held[key] = str(cpus)

    def created(self, key: str, cpus: str) -> None:
        """The runtime made the container on cpus (a decision since moves it elsewhere)."""
        if cpus:
            self.held[key] = cpus

    def took(self, key: str, cpus: str) -> None:
        """The runtime took an update of the container that did not go through here (a resize)."""
        self.held[key], self.landed[key] = cpus, time.monotonic()
        self.unmoved.discard(key)

    def sending(self, key: str) -> asyncio.Lock:
        """The lock an update of the container goes to the runtime under (pushes, kubelet's updates
        and resizes), so that the runtime takes them in the order they were sent: a push in flight
        landing after a resize would undo it, while the CPUs it gave up go to others."""
        return self._locks.setdefault(key, asyncio.Lock())

    def found(self, key: str, cpus: str) -> None:
        """A container adopted where the runtime runs it: those CPUs are held until a move of it lands
        (a container placed onto them waits), not those its first decision gives it."""
        if cpus:
            self.held[key] = cpus
            self.unmoved.add(key)

    def _new(self, key: str) -> CPUSet:
        """key's desired CPUs (none once it is gone: a push of many waits between its waves)."""
        c = self.ledger.containers.get(key)
        return CPUSet.parse_or_empty(c.resources.cpuset_cpus) if c is not None else CPUSet()

    def _leaves(self, key: str) -> CPUSet:
        """The CPUs the runtime runs key on that its desired resources leave (none, where not known)."""
        held, c = self.held.get(key), self.ledger.containers.get(key)
        if held is None or c is None or not c.resources.cpuset_cpus:
            return CPUSet()
        return CPUSet.parse_or_empty(held) - self._new(key)

    async def push(self, key: str, beside: frozenset[str] = frozenset()) -> None:
        """Send key's desired resources, unless they move it onto CPUs another container still runs
        on and is to leave (but those of beside: containers it may share them with while they move)."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        containers = self.ledger.containers
        async with self._slots, lock:
            c = containers.get(key)
            if c is None or not c.id or not c.pending or self._removed(c.id, c.pod_id):
                return  # gone, or an earlier push already sent the latest, or being removed
            if key in self.resizing:
                # Its resize sends what it runs with; what the ledger holds until then is the
                # decision before it, which may be onto the CPUs the resize moved others to.
                log.debug("container %s: not pushed, a resize of it is under way", c.id)
                self.wake()
                return
            res = c.resources
            if blocked := CPUSet.parse_or_empty(res.cpuset_cpus) & self._still_left(key, beside):
                # What is desired now (a decision since the order of these pushes was made) moves it
                # onto CPUs another container still runs on and is to leave: later, pending.
                log.debug("container %s: not moved yet, CPUs %s are not given up yet", c.id, blocked)
                self.wake()
                return
            starting = key in self.starting  # the runtime may start it from what it held before
            self._maybe(key, res.cpuset_cpus)  # until the runtime answers, it may run on either
            try:
                await self.runtime.update_resources(c.id, res)
            except Stopped:
                # Nothing of it runs anywhere: the move is as good as taken, and sending it again
                # only loads a runtime already slow to end it. What it holds returns when it is gone.
                log.debug("container %s: not updated, its processes have stopped", c.id)
                self.held[key] = res.cpuset_cpus
                self.unmoved.discard(key)
                if c.resources is res:
                    c.pending = False
                return
            except Exception as err:
                log.error("updating resources of container %s failed (will retry): %s", c.id, self.describe(err))
                self._maybe(key, res.cpuset_cpus)
                self.wake()
                return
            self.landed[key] = time.monotonic()
            raced = self._raced(key, starting)
            log.debug("container %s: cpus %s mems %s sent to the runtime%s", c.id, res.cpuset_cpus or "-",
                      res.cpuset_mems or "-", " (it is being started)" if raced else "")
            if raced:  # whoever gains the CPUs it leaves waits until it is sent again, started
                return
            self.held[key] = res.cpuset_cpus
            self.unmoved.discard(key)
            if c.resources is res:
                c.pending = False
        if not lock.locked() and key not in containers:
            self._locks.pop(key, None)

    async def push_all(self, keys: Iterable[str]) -> None:
        """Push keys in waves: a container goes once those leaving the CPUs it gets have gone (the
        runtime took their moves); one whose CPUs a refused move did not free waits, pending."""
        if not self.looked.is_set():  # pending until the first reconciliation has looked; it pushes them
            return
        containers = self.ledger.containers
        todo = [k for k in keys if (c := containers.get(k)) is not None and c.id]
        for gone in [k for k in self.held if k not in containers]:  # dropped with their pods
            del self.held[gone]
            self.landed.pop(gone, None)
            self.unmoved.discard(gone)
        todo += self._in_the_way(todo)
        tried: list[str] = []
        while todo:
            unfreed = CPUSet()
            for k in self.unconfirmed(tried):
                unfreed |= self._leaves(k)
            unfreed |= self._resized_off()
            waiting = [k for k in todo if self._new(k) & unfreed]
            if waiting:
                log.info("container(s) %s wait to move: CPUs %s are not given up yet",
                         ", ".join(containers[k].id[:12] for k in waiting), unfreed)
                self.wake()
                todo = [k for k in todo if k not in waiting]
            wave = movable(todo, self._leaves, self._new)
            beside: frozenset[str] = frozenset()
            if not wave:  # a cycle (a swap): one after the other steps aside, then they move
                for k in todo:
                    await self.narrow(k, todo)
                wave = movable(todo, self._leaves, self._new)
            if not wave:  # none could step aside: shared containers move onto each other's CPUs at once
                beside = frozenset(k for k in todo if self.shares(k))
                wave = [k for k in todo if k in beside
                        and not any(self._leaves(p) & self._new(k) for p in todo if p not in beside)]
                if not wave:
                    log.info("container(s) %s wait to move: each is to take CPUs another still runs on",
                             ", ".join(containers[k].id[:12] for k in todo))
                    self.wake()
                    return
            await asyncio.gather(*(self.push(k, beside) for k in wave))
            tried += wave
            todo = [k for k in todo if k not in wave]

    def _in_the_way(self, todo: list[str]) -> list[str]:
        """Containers outside todo still to leave CPUs one of todo moves onto (a move an earlier
        decision recorded and nobody has pushed yet: a resize refused half way, say): their moves
        go along, else the one moving in would share those CPUs with them until they are pushed."""
        extra: list[str] = []
        wanted = CPUSet()
        for k in todo:
            wanted |= self._new(k)
        while True:
            more = [k for k, c in self.ledger.containers.items() if k not in todo and k not in extra and c.id
                    and c.pending and c.state != ContainerState.EXITED and self._leaves(k) & wanted]
            if not more:
                return extra
            extra += more
            for k in more:
                wanted |= self._new(k)

    async def after_resizes(self, cpus: CPUSet | None, but: str, bound: float) -> list[str]:
        """Wait (bound seconds at most) until no resize under way, but but's, gives up any of cpus
        (None: until none is under way); returns the containers whose resizes still do."""
        end = time.monotonic() + bound
        while busy := [k for k, off in self.resizing.items() if k != but and (cpus is None or off & cpus)]:
            if time.monotonic() >= end:
                return busy
            await asyncio.sleep(0.1)
        return []

    def _still_left(self, key: str, beside: frozenset[str] = frozenset()) -> CPUSet:
        """The CPUs other containers (but those of beside) run on (as far as known) and are to
        leave, or a resize under way gives up."""
        out = self._resized_off()
        for k in self.ledger.containers:
            if k != key and k not in beside:
                out |= self._leaves(k)
        return out

    def still_left(self, key: str) -> CPUSet:
        """The CPUs key may not move onto yet: others run on them and are to leave (the cgroup writer's
        question, for a container whose move waits)."""
        return self._still_left(key)

    def _resized_off(self) -> CPUSet:
        """The CPUs resizes under way give up and still run on."""
        out = CPUSet()
        for cpus in self.resizing.values():
            out |= cpus
        return out

    def _gains(self, key: str) -> CPUSet:
        """The CPUs key moves onto that the runtime does not run it on (all of them, where not known)."""
        held = self.held.get(key)
        return self._new(key) - CPUSet.parse_or_empty(held) if held is not None else self._new(key)

    async def narrow(self, key: str, todo: list[str]) -> None:
        """Run key, for now, where it takes no CPU another of todo is still to leave and leaves all it
        is to leave (moves.aside), if anywhere. Its desired resources stay pending."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with self._slots, lock:
            # Decided once the lock is ours: a push that held it may have landed the move meanwhile
            # (many pushes queue up behind a frozen runtime), and a step decided before it would undo it.
            c = self.ledger.containers.get(key)
            keep = self._narrowed(key, todo)
            if c is None or keep is None or self._removed(c.id, c.pod_id):
                return
            starting = key in self.starting
            self._maybe(key, str(keep))
            try:
                await self.runtime.update_resources(c.id, dataclasses.replace(c.resources, cpuset_cpus=str(keep)))
            except Stopped:
                pass  # nothing of it runs on the CPUs it leaves
            except Exception as err:
                log.error("narrowing container %s to CPUs %s failed: %s", c.id, keep, self.describe(err))
                return
            if not self._raced(key, starting):
                self.held[key], self.landed[key] = str(keep), time.monotonic()

    def _narrowed(self, key: str, todo: list[str]) -> CPUSet | None:
        """Where narrow runs key for now (None: nowhere else, or its move is no longer pending)."""
        held = self.held.get(key)
        c = self.ledger.containers.get(key)
        if held is None or c is None or not c.id or not c.pending or key in self.resizing:
            return None
        runs = CPUSet.parse_or_empty(held)
        keep = aside(key, todo, runs, self._leaves, self._new, self._gains)
        if keep - self._resized_off() != keep:  # not onto CPUs a resize under way still runs on
            keep = runs & keep
        keep -= self._still_left(key) - runs  # nor onto those another, in this push or not, is to leave
        return keep if keep and keep != runs else None

    def _maybe(self, key: str, cpus: str) -> None:
        """An update that failed may have been taken (a deadline passed, say): the container may run
        on its old CPUs or on those."""
        held = self.held.get(key)
        if held is not None and cpus:
            self.held[key] = str(CPUSet.parse_or_empty(held) | CPUSet.parse_or_empty(cpus))

    async def step_aside(self, key: str, avoid: CPUSet) -> bool:
        """Run key, for now, on its desired CPUs but avoid (those a resize gives up) and those others
        run on and are still to leave; its desired resources stay pending. False where the runtime
        did not take it, or nothing would be left."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with self._slots, lock:
            c = self.ledger.containers.get(key)  # decided once the lock is ours (narrow says why)
            if c is None or not c.id or self._removed(c.id, c.pod_id):
                return True
            now = self._new(key) - avoid - self._still_left(key)  # nor onto CPUs others are still to leave
            if not now:
                return False
            starting = key in self.starting
            self._maybe(key, str(now))
            try:
                await self.runtime.update_resources(c.id, dataclasses.replace(c.resources, cpuset_cpus=str(now)))
            except Stopped:
                return True
            except Exception as err:
                log.error("moving container %s to CPUs %s failed: %s", c.id, now, self.describe(err))
                self._maybe(key, str(now))
                return False
            if self._raced(key, starting):
                return False
            self.held[key], self.landed[key] = str(now), time.monotonic()
        return True

    def _raced(self, key: str, starting: bool) -> bool:
        """An update sent while the runtime was starting the container is not taken: the runtime may
        have made its task from what it held before. It is sent again once started (start.py)."""
        if starting or key in self.starting:
            self.raced.add(key)
            return True
        return False

    def unconfirmed(self, keys: Iterable[str]) -> list[str]:
        """Those of keys whose last update the runtime has not taken (gone or exited ones aside)."""
        containers = self.ledger.containers
        return [k for k in keys if (c := containers.get(k)) is not None and c.pending
                and c.state != ContainerState.EXITED]

    async def until_taken(self, keys: list[str], deadline: float | None) -> list[str]:
        """Push keys again and again until the runtime has taken them all or the caller's deadline
        (monotonic) is near; returns those it has not taken."""
        blocking = self.unconfirmed(keys)
        wait = RETRY_FIRST
        while blocking:
            # A push the runtime is slow to answer must not make the answer miss the caller's deadline.
            left = None if deadline is None else max(0.5, deadline - ANSWER_MARGIN - time.monotonic())
            try:
                async with asyncio.timeout(left):
                    await self.push_all(blocking)
            except TimeoutError:
                pass  # still pending: the caller refuses, reconciliation pushes again
            blocking = self.unconfirmed(blocking)
            if not blocking or deadline is None or time.monotonic() + wait > deadline - ANSWER_MARGIN:
                break
            await asyncio.sleep(wait)  # a runtime slow to take updates: again, while the caller waits
            wait = min(wait * 2, RETRY_MAX)
            blocking = self.unconfirmed(blocking)
        return blocking

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
        self.starting.pop(key, None)
        self.held.pop(key, None)
        self.landed.pop(key, None)
        self.unmoved.discard(key)
        lock = self._locks.get(key)
        if lock is not None and not lock.locked():  # a push in flight drops it when it ends
            del self._locks[key]


def _union(cpu_lists: Iterable[str]) -> CPUSet:
    """The CPUs of every list (one a source: the cgroup, the runtime's status)."""
    out = CPUSet()
    for one in cpu_lists:
        out |= CPUSet.parse_or_empty(one)
    return out
