"""The engine's Runtime in NRI mode: what the runtime last told us, and how updates reach it.

The runtime tells an NRI plugin everything it runs (Synchronize) and every change
(events), so reconciliation reads that record instead of asking the runtime. While
there is no connection the record is stale: listing fails, so nothing is decided
from it.

Container updates reach the runtime in one of two ways:
- inside an event that can carry them (Synchronize, CreateContainer, UpdateContainer,
  StopContainer): collected while the handler runs and put in its answer;
- otherwise (a new policy, a rebalance, a repair): queued and sent with UpdateContainers,
  one container a call (the runtime gives a call one deadline for all its updates).
  The runtime holds its plugin lock while an event is being answered and UpdateContainers
  waits for that lock, so nothing here ever waits for an UpdateContainers answer: the
  engine's push returns at once and one sender delivers the queue, newest value wins.
  Runtimes whose NRI takes its locks in the other order for UpdateContainers than for
  events (NRI before v0.12.1: containerd before 2.4.0) can deadlock when the two meet,
  and then every lifecycle call hangs until the runtime restarts. With those the queue
  rides on the next answer that carries updates (take_queued), or, once the plugin says
  no event has come for a while, goes out by synchronizing again (the connection ends and
  a new one registers; the Synchronize answer carries every update), which takes the locks
  in the safe order.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from resmgr.engine.moves import sequence as moves_in_order
from resmgr.frontends.nri import convert
from resmgr.generated.nri import api_pb2 as nri
from resmgr.model import Container, Pod, Resources
from resmgr.topology.cpuset import CPUSet

log = logging.getLogger("cri-resmgr.nri")

UPDATE_TIMEOUT = 10.0  # seconds without an answer to an UpdateContainers before it is logged
RESYNC_DELAY = 1.0  # seconds between two looks at whether a resynchronization may deliver the queue
RESYNC_GAP = 2.0  # seconds at least between two resynchronizations
VERIFY_MAX = 5  # synchronizations in a row that find what the one before carried not taken


@dataclass
class Collector:
    """Updates an event's answer carries (open while its handler runs)."""

    updates: dict[str, Resources] = field(default_factory=dict)
    open: bool = True


COLLECTING: contextvars.ContextVar[Collector | None] = contextvars.ContextVar("nri_collecting", default=None)


@contextlib.contextmanager
def collecting() -> Iterator[Collector]:
    """Collect the updates pushed while the block runs (and by the tasks it starts) for an answer.

    Tasks copy the context when they start, so one still running after the block sees the
    collector closed and sends with UpdateContainers instead.
    """
    collector = Collector()
    token = COLLECTING.set(collector)
    try:
        yield collector
    finally:
        collector.open = False
        COLLECTING.reset(token)

Send = Callable[[list[nri.ContainerUpdate]], Awaitable[list[nri.ContainerUpdate]]]


class NriRuntime:
    def __init__(self) -> None:
        self.pods: dict[str, nri.PodSandbox] = {}
        self.containers: dict[str, nri.Container] = {}
        self._send: Send | None = None  # UpdateContainers over the live connection
        self._outbox: dict[str, Resources] = {}
        self._sending: dict[str, Resources] = {}  # the UpdateContainers call in flight
        self._latest: dict[str, Resources] = {}  # the newest value given per container
        # The updates the runtime failed or refused (a deadline of its own, a busy shim): until one
        # lands, reconciliation writes the container's cgroup rather than wait for the runtime.
        self._failed: dict[str, Resources] = {}
        self._kick = asyncio.Event()
        self.on_failure: Callable[[], None] = lambda: None  # the engine's retry (with backoff)
        # Set while this runtime's UpdateContainers is unsafe: ends the connection so that a new
        # Synchronize delivers the queue; returns False when it cannot now (an event in flight).
        self.resync: Callable[[], bool] | None = None
        self._last_resync = 0.0
        # The runtime ignores the updates of a Synchronize answer it fails to apply, and reports
        # no failure: the next synchronization shows where the containers really run.
        self._verify = False
        self._verify_streak = 0

    # -- the record ------------------------------------------------------------------------
    def connected(self, send: Send | None) -> None:
        self._send = send
        if send is not None and self._outbox:
            self._kick.set()

    def replace(self, pods: list[nri.PodSandbox], containers: list[nri.Container]) -> None:
        self.pods = {p.id: p for p in pods if p.id}
        self.containers = {c.id: c for c in containers if c.id}
        self._latest = {k: v for k, v in self._latest.items() if k in self.containers}
        self._failed = {k: v for k, v in self._failed.items() if k in self.containers}
        self._outbox.clear()  # what was queued is superseded by what this synchronization decides

    def seen_pod(self, p: nri.PodSandbox) -> None:
        self.pods[p.id] = p

    def seen_container(self, c: nri.Container, state: int | None = None) -> None:
        known = self.containers.get(c.id)
        copy = nri.Container()
        copy.CopyFrom(c)
        if known is not None and known.linux.resources.cpu.cpus and not c.linux.resources.cpu.cpus:
            copy.linux.resources.cpu.cpus = known.linux.resources.cpu.cpus
            copy.linux.resources.cpu.mems = known.linux.resources.cpu.mems
        if state is not None:
            copy.state = state
        self.containers[c.id] = copy

    def gone_container(self, container_id: str) -> None:
        self._failed.pop(container_id, None)
        self.containers.pop(container_id, None)
        self._latest.pop(container_id, None)
        self._outbox.pop(container_id, None)

    def gone_pod(self, pod_id: str) -> None:
        self.pods.pop(pod_id, None)
        for cid in [cid for cid, c in self.containers.items() if c.pod_sandbox_id == pod_id]:
            self.gone_container(cid)

    def applied(self, container_id: str, res: Resources) -> None:
        """The runtime took res for the container: it runs with that cpuset now."""
        self._failed.pop(container_id, None)
        c = self.containers.get(container_id)
        if c is not None:
            if res.cpuset_cpus:
                c.linux.resources.cpu.cpus = res.cpuset_cpus
            if res.cpuset_mems:
                c.linux.resources.cpu.mems = res.cpuset_mems

    # -- the engine's Runtime -------------------------------------------------------------------
    def _check(self) -> None:
        if self._send is None:
            raise ConnectionError("not connected to the runtime's NRI socket")

    async def list_pods(self) -> list[Pod]:
        self._check()
        return [convert.pod(p) for p in self.pods.values()]

    async def pod_details(self, pod: Pod) -> Pod:
        return pod  # NRI pods arrive complete

    async def list_containers(self, pod_id: str = "") -> list[Container]:
        self._check()
        return [convert.container(c) for c in self.containers.values() if not pod_id or c.pod_sandbox_id == pod_id]

    async def container_details(self, c: Container) -> tuple[Container, list[str]]:
        return c, []  # NRI names devices by their path in the container, not on the host

    async def running_resources(self, container_id: str) -> tuple[str, str] | None:
        c = self.containers.get(container_id)
        if c is None or not c.linux.HasField("resources"):
            return None
        return c.linux.resources.cpu.cpus, c.linux.resources.cpu.mems

    def delivering(self, container_id: str) -> bool:
        return container_id in self._outbox or container_id in self._sending

    def failed_update(self, container_id: str) -> Resources | None:
        return None if self.delivering(container_id) else self._failed.get(container_id)

    async def update_resources(self, container_id: str, res: Resources) -> None:
        self._latest[container_id] = res
        collector = COLLECTING.get()
        if collector is not None and collector.open:
            collector.updates[container_id] = res
            self._outbox.pop(container_id, None)
            return
        self._check()
        self._outbox[container_id] = res
        self._kick.set()

    # -- delivering the queue --------------------------------------------------------------------
    async def run_sender(self) -> None:
        """Send queued updates with UpdateContainers, one call at a time, for as long as we run."""
        while True:
            await self._kick.wait()
            self._kick.clear()
            send = self._send
            if send is None or not (self._outbox or self._verify):
                continue
            if self.resync is not None:
                await self._resync()
                continue
            self._verify = False
            if not self._outbox:
                continue
            batch = self._sending = self._outbox
            self._outbox = {}
            try:
                failed, sent = await self._deliver(send, batch)
            finally:
                self._sending = {}
            for cid, res in batch.items():
                newest = self._latest.get(cid, res) is res
                if cid in failed and newest:
                    self._failed[cid] = res
                elif cid in sent:
                    self.applied(cid, res)  # what it runs with now, the newest value or not
                    if not newest and cid not in self._outbox:
                        # A newer value went out meanwhile in an event's answer, which the runtime
                        # may have applied before this call: sent again, it wins.
                        self._outbox[cid] = self._latest[cid]
                        self._kick.set()
            if failed:
                why = "; ".join(f"{cid[:12]}: {reason}" for cid, reason in list(failed.items())[:3])
                log.warning("UpdateContainers failed for %d of %d container(s) (%s); reconciliation repairs them",
                            len(failed), len(batch), why)
                self.on_failure()

    async def _deliver(self, send: Send, batch: dict[str, Resources]) -> tuple[dict[str, str], set[str]]:
        """Each step of batch in an UpdateContainers call of its own, one after the other; why each
        container that failed did, and those whose value the runtime took. containerd gives a call
        one deadline for all its updates: on a busy node the first used it up and every later one
        failed at once ("failed to get task: context deadline exceeded"), call after call. A step
        onto CPUs that a container whose step failed still holds is not sent (it fails too): the
        kernel would run both there. Nor is one of a container given a newer value meanwhile (an
        event's answer carried it, or it waits in the queue): sent after it, it would undo it."""
        failed: dict[str, str] = {}
        sent: set[str] = set()
        stuck = CPUSet()  # CPUs the containers of failed steps were to leave, and still run on
        for cid, res in self.in_order(batch):
            if cid in failed or self._latest.get(cid, batch[cid]) is not batch[cid]:
                continue
            cpus = CPUSet.parse_or_empty(res.cpuset_cpus)
            if cpus & stuck:
                failed[cid] = f"not sent: CPUs {cpus & stuck} are not given up yet"
                continue
            known = self.containers.get(cid)
            held = CPUSet.parse_or_empty(known.linux.resources.cpu.cpus) if known is not None else CPUSet()
            try:
                refused = await self._answer(asyncio.ensure_future(send([convert.update(cid, res)])), cid)
            except ConnectionError as err:  # nothing more goes over this connection
                for other in batch:
                    failed.setdefault(other, str(err) or type(err).__name__)
                break
            except Exception as err:
                refused, failed[cid] = [], str(err) or type(err).__name__
            if refused:
                failed[cid] = "refused"
            if cid in failed:
                stuck |= held - cpus
            elif res is not batch[cid]:
                self.applied(cid, res)  # a step on the way (a swap's step aside): where it runs now
            else:
                sent.add(cid)
        return failed, sent

    def in_order(self, updates: dict[str, Resources], narrow: bool = True) -> list[tuple[str, Resources]]:
        """updates in an order the runtime can apply one after the other without a container on a CPU
        another is still to leave (resmgr/engine/moves.py); with narrow, a swap's members first go to
        the CPUs they keep (a call may name a container twice; an event's answer may not)."""
        def running(cid: str) -> CPUSet:
            c = self.containers.get(cid)
            return CPUSet.parse_or_empty(c.linux.resources.cpu.cpus) if c is not None else CPUSet()

        moves = {cid: (running(cid), CPUSet.parse_or_empty(res.cpuset_cpus)) for cid, res in updates.items()}
        steps = []
        for cid, cpus in moves_in_order(moves, narrow):
            res = updates[cid]
            steps.append((cid, res if cpus == moves[cid][1] else dataclasses.replace(res, cpuset_cpus=str(cpus))))
        return steps

    @staticmethod
    async def _answer(call: asyncio.Future[list[nri.ContainerUpdate]], cid: str) -> list[nri.ContainerUpdate]:
        """The runtime's answer to an UpdateContainers, however long it takes. A runtime that is
        stopped or busy queues the calls it has not read and runs them all once it goes on, in any
        order: a second call with newer values while one is unanswered could be overtaken by the
        stale one. So no other goes out until this one is answered, or fails with the connection."""
        done, _ = await asyncio.wait({call}, timeout=UPDATE_TIMEOUT)
        if not done:
            log.warning("UpdateContainers for container %s has had no answer for %.0f s; no other is sent "
                        "until it has", cid, UPDATE_TIMEOUT)
        return await call

    def queue(self, updates: dict[str, Resources]) -> int:
        """Updates for UpdateContainers to deliver (it reports those the runtime refused); how many."""
        self._latest.update(updates)
        self._outbox.update(updates)
        if updates:
            self._kick.set()
        return len(updates)

    def take_queued(self, skip: str = "") -> dict[str, Resources]:
        """The queued updates (but skip's), for an event's answer to carry instead."""
        taken = {cid: res for cid, res in self._outbox.items() if cid != skip}
        for cid in taken:
            del self._outbox[cid]
        return taken

    async def _resync(self) -> None:
        """Deliver the queue by synchronizing again, once no event's answer has carried it."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(RESYNC_DELAY, self._last_resync + RESYNC_GAP - loop.time()))
        resync = self.resync
        if not (self._outbox or self._verify) or self._send is None or resync is None:
            return
        if not resync():
            self._kick.set()  # an event is being answered: its answer may carry them, else later
            return
        if self._outbox:
            log.info("NRI: synchronizing with the runtime again to deliver %d container update(s)",
                     len(self._outbox))
        else:
            log.info("NRI: synchronizing with the runtime again to see that it took the last one's updates")
        self._last_resync = loop.time()
        self._outbox.clear()  # the Synchronize answer decides them afresh
        self._verify = False

    def synchronized(self, carried: int) -> None:
        """A Synchronize answer carried that many updates: where the runtime may be synchronized
        again, one more synchronization sees whether it took them (a few in a row at most)."""
        if not carried or self.resync is None:
            self._verify, self._verify_streak = False, 0
            return
        self._verify_streak += 1
        if self._verify_streak > VERIFY_MAX:
            log.warning("NRI: the runtime has not taken container updates in %d synchronizations in a row; "
                        "left to the next event or reconciliation", VERIFY_MAX)
            self._verify, self._verify_streak = False, 0
            return
        self._verify = True
        self._kick.set()

