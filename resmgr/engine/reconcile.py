"""Reconciliation: the engine's record compared with what the runtime runs, and repaired.

It runs at start-up, then every reconcile interval, and soon after any runtime call
whose outcome is unknown. In one round:

- pods and containers the runtime no longer has are dropped and release what they held;
- containers that exited release theirs; one we released that the runtime still lists running a
  minute later is allocated again (containerd answers a stop before its record says so); one
  still "created" in a pod stopped since can never start, holds nothing and is sent nothing;
- creates whose outcome was unknown (the runtime failed or the caller went away) are
  settled: adopted with the grant decided for them if the runtime has them, else released;
- pods and containers made behind our back (or while we were down) are adopted and
  allocated before anything new is decided, keeping the exclusive CPUs they run on when
  that is consistent; one that does not fit runs as a plain shared container until it does; one
  adopted before it started is updated again once it has (its start may have been under way);
- every live container whose cgroup or runtime-reported cpuset differs from its grant, or
  whose last update never reached the runtime, is updated again; one whose cgroup still differs
  the round after the runtime took that update (a runtime that lost the container's task answers
  success and changes nothing) has its cgroup's cpuset written here, and its systemd scope told;
- where the runtime's listing gives every container's limits afresh (NRI's Synchronize), one
  whose CPU or memory limits differ from those we gave it was resized while we were away (the
  runtime took kubelet's update alone): it is placed again for them, as a resize through us is.

Nothing the runtime returns makes a round fail: what cannot be read is logged and skipped.
Observation (runtime calls) happens without the engine lock; repairs are decided under it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from resmgr.engine.kernel import CgroupWriter
from resmgr.engine.state import EngineState, brief
from resmgr.model import Container, ContainerState, Decision, Pod, PodState, Resources
from resmgr.policies.base import PolicyError
from resmgr.topology.cpuset import CPUSet

log = logging.getLogger("cri-resmgr.engine")

RETRY_MIN = 0.5  # seconds before the first retry of a failed round
PARALLEL = 8  # runtime status calls in flight at once
# How long after its call failed a create the runtime does not list counts as never made: a runtime
# may still finish a create whose caller went away.
SETTLE_GRACE = 2.0

T = TypeVar("T")


@dataclass
class Observation:
    start_seq: int
    listed_at: float  # time.monotonic() before the runtime was asked
    unsettled: set[str]
    pods: dict[str, Pod]  # as the runtime lists them
    containers: dict[str, Container]
    new_pods: dict[str, Pod] = field(default_factory=dict)
    new_containers: dict[str, Container] = field(default_factory=dict)
    actual: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # id -> (cpus, mems) per source
    cgroups: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (cpus, mems) in its cgroup


@dataclass
class Outcome:
    adopted_pods: int = 0
    adopted: int = 0
    dropped_pods: int = 0
    dropped: int = 0
    exited: int = 0
    settled: int = 0
    repaired: int = 0
    revived: int = 0
    resized: int = 0
    unapplied: list[Container] = field(default_factory=list)  # cgroups to write: the runtime took no update

    def changed(self) -> bool:
        """Anything the state records changed (a cgroup written changes nothing recorded)."""
        return any(getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "unapplied")


async def _limited(items: Iterable[T], fn: Callable[[T], Awaitable[Any]]) -> list[Any]:
    slots = asyncio.Semaphore(PARALLEL)

    async def one(item: T) -> Any:
        async with slots:
            return await fn(item)

    return await asyncio.gather(*(one(i) for i in items))


# The limits kubelet sets and resizes, as the runtime reports them.
LIMITS = ("cpu_shares", "cpu_quota", "cpu_period", "memory_limit_in_bytes")


def _describe_limits(limits: dict[str, int]) -> str:
    return ", ".join(f"{name} {value}" for name, value in limits.items())


def _same(actual: str, wanted: str) -> bool:
    try:
        return CPUSet.parse(actual) == CPUSet.parse(wanted)
    except ValueError:
        return False


class Reconciler:
    """Repairs the engine's state against the runtime (state.py; it needs none of the lifecycle steps)."""

    def __init__(self, state: EngineState) -> None:
        self.state = state
        self._sweep_lock = asyncio.Lock()  # one round at a time
        self._swept = False  # a round has completed since start-up
        self._pushed: dict[str, tuple[str, str]] = {}  # by container: the cpuset a repair pushed last round
        self.cgroups = CgroupWriter(state)  # where the runtime has not applied an update

    # -- the loop ----------------------------------------------------------------------
    async def run(self, interval: float) -> None:
        """Reconcile every interval (0: only when woken), and retry a failed round with backoff."""
        failures = 0
        while True:
            if failures:
                await asyncio.sleep(min(RETRY_MIN * 2 ** (failures - 1), interval or 10.0))
            else:
                try:
                    # Not asyncio.wait_for: in 3.11 it drops a cancellation that lands as the
                    # event is set, and the loop would outlive the daemon's shutdown.
                    async with asyncio.timeout(interval or None):
                        await self.state.woken.wait()
                except TimeoutError:
                    pass
            self.state.woken.clear()
            try:
                await self.reconcile()
            except Exception as err:  # the runtime is away, or it said something odd: try again
                failures += 1
                (log.warning if failures == 1 else log.debug)("reconciliation with the runtime failed: %s",
                                                              brief(err))
                continue
            if failures:
                log.info("reconciliation with the runtime works again")
            failures = 0

    async def reconcile(self, limits: bool = False) -> None:
        """One round: observe the runtime, repair the state, push what is pending, save.

        limits: the runtime's listing holds each container's limits as the runtime has them
        now, not as we last told it (NRI's Synchronize; no event can race with it).
        """
        async with self._sweep_lock:
            started = time.perf_counter()
            first = not self.state.reconciled.is_set() or not self._swept
            obs = await self._observe()
            async with self.state.lock:
                outcome, fresh = self._commit(obs, limits)  # its decisions recorded as made (_took)
            self.state.pusher.looked.set()  # where containers run is known: moves may go
            await self.state.pusher.push_pending()
            for c in outcome.unapplied:
                why = "it failed it" if self.state.runtime.failed_update(c.id) is not None else \
                    "it took it, runs as before"
                await self.cgroups.write(c, why)
            if first:
                await self.state.reapply()  # containers started while we were away join their classes too
            else:
                for c in fresh:
                    await self.state.controllers_apply(c)
            if first or outcome.changed():
                await self.state.save()
            self._swept = True
            self.state.reconciled.set()
        log.debug("reconciliation round: %d containers checked in %.1f ms", len(obs.actual),
                  (time.perf_counter() - started) * 1000)
        if first or outcome.changed():
            log.info("reconciled with the runtime: %d pods, %d containers known; adopted %d pods, %d containers; "
                     "dropped %d pods, %d containers; %d exited, %d settled, %d repaired, %d revived, %d resized",
                     len(self.state.pods), len(self.state.containers), outcome.adopted_pods, outcome.adopted,
                     outcome.dropped_pods, outcome.dropped, outcome.exited, outcome.settled, outcome.repaired,
                     outcome.revived, outcome.resized)

    # -- observing ----------------------------------------------------------------------
    async def _observe(self) -> Observation:
        start_seq, unsettled, listed_at = self.state.ledger.seq, set(self.state.ledger.unsettled), time.monotonic()
        pods = {p.id: p for p in await self.state.runtime.list_pods() if p.id}
        ctrs = {c.id: c for c in await self.state.runtime.list_containers() if c.id}
        obs = Observation(start_seq, listed_at, unsettled, pods, ctrs)
        # Creates in flight now: the runtime may list them before they return to us.
        in_flight = {(c.pod_id, c.name, c.attempt) for k, c in self.state.containers.items()
                     if not c.id and k not in unsettled}
        new_pods = [p for pid, p in pods.items() if pid not in self.state.pods]
        for pod in await _limited(new_pods, self._adopt_pod):
            obs.new_pods[pod.id] = pod
        new = [c for cid, c in ctrs.items() if cid not in self.state.containers and c.state.live
               and (c.pod_id, c.name, c.attempt) not in in_flight]
        for c in await _limited(new, self._adopt_container):
            if c is not None:
                obs.new_containers[c.id] = c
        known = [c for c in self.state.containers.values() if c.id and c.state != ContainerState.EXITED
                 and ctrs.get(c.id) is not None and ctrs[c.id].state.live]
        for c, (cg, seen) in zip(known, await _limited(known, self._actual), strict=True):
            obs.actual[c.id] = seen
            if cg is not None:
                obs.cgroups[c.id] = cg
        return obs

    async def _actual(self, c: Container) -> tuple[tuple[str, str] | None, list[tuple[str, str]]]:
        """The cpuset a container runs with: in its cgroup, and from each source (the cgroup, the runtime)."""
        seen, cg = [], None
        pod = self.state.pods.get(c.pod_id)
        if self.state.cpusets is not None and pod is not None:
            cg = await asyncio.to_thread(self.state.cpusets.read, pod.cgroup_parent, c.id)
            if cg is not None:
                seen.append(cg)
        try:
            reported = await self.state.runtime.running_resources(c.id)
            if reported is not None:
                seen.append(reported)
        except Exception as err:  # gone meanwhile, or the runtime hiccuped: the next round sees
            log.debug("no status for container %s: %s", c.id, brief(err))
        return cg, seen

    async def _adopt_pod(self, p: Pod) -> Pod:
        try:
            return await self.state.runtime.pod_details(p)
        except Exception as err:  # status may race with removal; adopt with what we have
            log.warning("no verbose status for pod %s: %s", p.id, brief(err))
            return p

    async def _adopt_container(self, c: Container) -> Container | None:
        try:
            full, devices = await self.state.runtime.container_details(c)
        except Exception as err:
            log.warning("no status for container %s, not adopting it yet: %s", c.id, brief(err))
            return None
        full.hints = await asyncio.to_thread(self.state.device_hints, [d for d in devices if d])
        return full

    # -- repairing (engine lock held) -------------------------------------------------
    def _commit(self, obs: Observation, limits: bool = False) -> tuple[Outcome, list[Container]]:
        out, fresh = Outcome(), []
        for pod in [p for p in self.state.pods.values() if p.id not in obs.pods and p.seq <= obs.start_seq]:
            # Gone without kubelet removing it (the node rebooted, say): kubelet may make it anew.
            self._took(self.state.drop_pod(pod, vanished=True).updates)
            out.dropped_pods += 1
        for c in list(self.state.containers.values()):
            if not c.id or c.seq > obs.start_seq:
                continue
            live = obs.containers.get(c.id)
            sandbox = obs.pods.get(c.pod_id)
            # Its pod went down with it (a reboot; containerd keeps the sandbox, not ready): kubelet
            # makes it again.
            down = self.state.rebooted or _stopped(sandbox)
            if live is None or c.pod_id not in self.state.pods:
                if down:
                    self.state.ledger.await_return(c)
                log.debug("container %s (%s) is gone from the runtime; forgotten", c.id, c.name)
                self._took(self.ended(c, None).updates)
                out.dropped += 1
            elif live.state == ContainerState.EXITED:
                if c.state != ContainerState.EXITED:
                    if down:
                        self.state.ledger.await_return(c)
                    self._took(self.ended(c, live).updates)
                    out.exited += 1
            elif live.state == ContainerState.CREATED and _stopped(sandbox):
                # Made in a pod stopped since: it can never start. It holds nothing, and is sent
                # nothing: an update racing with its removal makes containerd 2.3 panic.
                if c.state != ContainerState.EXITED:
                    self._took(self.state.release(c).updates)
                    out.exited += 1
            elif live.state.live:
                if c.state == ContainerState.EXITED:  # released, yet it runs: it needs a grant again
                    if self.state.ledger.released_lately(c):
                        continue  # the runtime's record has not caught up with the stop yet
                    log.warning("container %s was released but still runs; allocating it again", c.id)
                    self.state.ledger.revive(c, live.state)
                    out.revived += 1
                    continue
                self.state.ledger.seen(c, live.state)
                if c.pending:
                    self.state.pusher.seen_pending(c.key, [cpus for cpus, _ in obs.actual.get(c.id, [])])
                moved = self._resized(c, live.requested) if limits and not c.pending else None
                if moved is not None:
                    self._took(moved)
                    out.resized += 1
                elif not c.pending and not self.state.runtime.delivering(c.id):
                    self._repair(c, obs, out)
        out.settled += self._settle_in(obs.unsettled, obs.listed_at, obs.containers.values(), obs.new_containers,
                                       fresh)
        for live_pod in obs.pods.values():
            if live_pod.id in self.state.pods and live_pod.state == PodState.NOT_READY:
                self.state.pods[live_pod.id].state = PodState.NOT_READY
        for pid, pod in obs.new_pods.items():
            if pid not in self.state.pods:
                self.state.ledger.add_pod(pod)
                out.adopted_pods += 1
        for cid, c in obs.new_containers.items():
            if cid in self.state.containers or c.pod_id not in self.state.pods:
                continue
            if c.state == ContainerState.CREATED and _stopped(obs.pods.get(c.pod_id)):
                continue  # it can never start (see above)
            log.debug("container %s (%s) found running on cpus %s; adopted", cid, c.name,
                      c.resources.cpuset_cpus or "-")
            self.state.ledger.enter(c)
            self.state.pusher.found(c.key, c.resources.cpuset_cpus)  # held until its move lands
            self.state.ledger.await_grant(cid)
            if c.state == ContainerState.CREATED:
                # The runtime may be starting it from what it held before: the update we send now can
                # reach its record and not the task being made, so it is sent again once started.
                self.state.pusher.raced.add(cid)
            fresh.append(c)
            out.adopted += 1
        self.allocate_waiting()  # recorded as made; the round pushes what is pending
        self.state.rebooted = False
        for key in [k for k in self._pushed if k not in self.state.containers]:
            del self._pushed[key]
        self.cgroups.forget_gone()
        return out, fresh

    def _took(self, updates: dict[str, Resources]) -> None:
        """One decision's updates recorded at once (the next decision of the round decides from
        them: a container moved by one and left alone by the next keeps the latest place); the
        round pushes what is pending."""
        self.state.record(updates)

    def _repair(self, c: Container, obs: Observation, out: Outcome) -> None:
        """Push c again where it runs with other CPUs or memory nodes than granted; where its cgroup
        still does after the runtime took that very push, write the cgroup (after the round)."""
        seen = obs.actual.get(c.id, [])
        if not c.pending:
            self.state.pusher.observed(c.key, [cpus for cpus, _ in seen], obs.listed_at)
        if not self._differs(c, seen):
            self._pushed.pop(c.key, None)
            return
        wanted = (c.resources.cpuset_cpus, c.resources.cpuset_mems)
        cg = obs.cgroups.get(c.id)
        failed = self.state.runtime.failed_update(c.id)
        # Pushed once more and still not applied, or failed by the runtime (its deadline passed on a
        # busy node): the cgroup is written, not left to a runtime that may fail it again for a while.
        tried = self._pushed.get(c.key) == wanted or (
            failed is not None and (failed.cpuset_cpus, failed.cpuset_mems) == wanted)
        if tried and cg is not None and self._differs(c, [cg]):
            out.unapplied.append(c)
            return
        log.warning("container %s runs with other CPUs or memory nodes than granted (%s); updating it again",
                    c.id, self._describe_actual(seen))
        self._pushed[c.key] = wanted
        c.pending = True
        out.repaired += 1

    def ended(self, c: Container, listed: Container | None) -> Decision:
        """What c gives back, as the runtime lists it (None: not at all): removed, it is forgotten;
        exited, released; otherwise it keeps its grant."""
        if listed is None:
            return self.state.forget(c)
        if listed.state == ContainerState.EXITED:
            return self.state.release(c)
        return Decision()

    def _resized(self, c: Container, held: Resources) -> dict[str, Resources] | None:
        """c placed again for the CPU and memory limits the runtime holds, where they differ from
        those we gave it (the updates to push); None where they do not, or the policy cannot meet them."""
        changed = {}
        for name in LIMITS:
            theirs, ours, asked = getattr(held, name), getattr(c.resources, name), getattr(c.requested, name)
            # A limit we never set is not ours to judge; one still as kubelet last asked is not a
            # resize (a value of the policy's own that did not reach the runtime, say).
            if theirs and ours and theirs != ours and theirs != asked:
                changed[name] = theirs
        pod = self.state.pods.get(c.pod_id)
        if not changed or pod is None:
            return None
        requested = dataclasses.replace(c.requested, **changed)
        try:
            placed = self.state.policy.resize(c, pod, requested, self.state.view())
        except PolicyError as err:
            log.warning("container %s was resized while we were away (%s), and cannot be placed for it: %s; it "
                        "keeps its CPUs", c.id, _describe_limits(changed), err)
            return None
        log.warning("container %s was resized while we were away (%s); placing it again", c.id,
                    _describe_limits(changed))
        kept = c.adjusted.without(c.requested.differing(requested)) if c.adjusted else None  # kubelet's word wins
        c.requested, c.adjusted = requested, kept
        c.resources = (placed.resources or requested).overlaid(kept)
        self.state.ledger.apply(c, Decision(classes=placed.classes))
        return {**placed.updates, c.key: c.resources}

    def _differs(self, c: Container, seen: list[tuple[str, str]]) -> bool:
        want_cpus, want_mems = c.resources.cpuset_cpus, c.resources.cpuset_mems
        return any((want_cpus and not _same(cpus, want_cpus)) or (want_mems and not _same(mems, want_mems))
                   for cpus, mems in seen)

    @staticmethod
    def _describe_actual(seen: list[tuple[str, str]]) -> str:
        return "; ".join(f"cpus {cpus or '-'} mems {mems or '-'}" for cpus, mems in seen)

    def _settle_in(self, keys: set[str], listed_at: float, live: Iterable[Container],
                   adopted: dict[str, Container], fresh: list[Container]) -> int:
        """Settle the creates in keys whose outcome was unknown, against a runtime listing taken after they failed.

        One the listing does not show is taken as never made only once SETTLE_GRACE has passed since
        its call failed: until then the runtime may still be making it, and it keeps its grant.
        """
        by_name = {(c.pod_id, c.name, c.attempt): c for c in live}
        settled = 0
        for key in sorted(keys & set(self.state.ledger.unsettled)):
            c = self.state.containers.get(key)
            if c is None or c.id:
                self.state.ledger.settled(key)
                continue
            match = by_name.get((c.pod_id, c.name, c.attempt))
            since = self.state.ledger.unsettled_since(key)
            if match is None and since is not None and listed_at < since + SETTLE_GRACE:
                continue  # too early to tell
            self.state.ledger.settled(key)
            settled += 1
            if match is None or match.id in self.state.containers or not match.state.live:
                log.info("create of %s (pod %s) did not happen in the runtime; released", c.name, c.pod_id)
                self.state.record(self.state.forget(c).updates)  # its deferred update goes with it
                continue
            late = self.state.ledger.made(c, match.id, match.state)
            twin = adopted.pop(match.id, None)
            if late is not None:
                c.resources = late.overlaid(c.adjusted)
            c.pending = late is not None or twin is None or twin.resources != c.resources
            fresh.append(c)
            log.info("create of %s (pod %s) did happen in the runtime: container %s keeps its grant",
                     c.name, c.pod_id, c.id)
        return settled

    async def settle(self, pod_id: str) -> None:
        """Settle unknown creates in one pod now (a caller retries one of them)."""
        listed_at = time.monotonic()
        live = await self.state.runtime.list_containers(pod_id)
        async with self.state.lock:
            keys = {k for k in self.state.ledger.unsettled
                    if (c := self.state.containers.get(k)) is not None and c.pod_id == pod_id}
            fresh: list[Container] = []
            self._settle_in(keys, listed_at, live, {}, fresh)
        await self.state.pusher.push_pending()

    def allocate_waiting(self) -> dict[str, Resources]:
        """Allocate containers the policy holds nothing for, and retry those that did not fit; each
        decision recorded as made (the next one decides from it). The updates to push."""
        updates: dict[str, Resources] = {}
        for c in self.state.ledger.waiting():
            pod = self.state.pods[c.pod_id]
            degraded = c.key in self.state.ledger.degraded
            try:
                decision = self.state.ledger.place_waiting(c, pod)
                if degraded:
                    log.info("container %s now gets what it asks for", c.id)
            except PolicyError as err:
                if degraded:
                    continue  # still no room; it keeps running as a shared container
                decision = self.state.ledger.place_plainly(c, pod, err)
                if decision is None:
                    continue  # left in _unallocated: tried again next round
            except Exception:  # a policy bug on one container must not stop every round
                log.exception("allocating container %s failed; it runs as it is until a later round", c.id)
                continue
            self.state.ledger.granted(c.key)
            self.state.ledger.apply(c, decision)
            made = {**decision.updates, **({c.key: c.resources} if decision.resources is not None else {})}
            self.state.record(made)  # the next container's decision sees these moves
            updates.update(made)
        return updates


def _stopped(sandbox: Pod | None) -> bool:
    """Whether a pod as the runtime lists it is gone or stopped: its containers can no longer start."""
    return sandbox is None or sandbox.state == PodState.NOT_READY
