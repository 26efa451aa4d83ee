"""The engine: owns pod and container state, asks the policy, applies decisions.

It speaks the model only (resmgr.model); each front end translates its protocol. A
lifecycle call that needs a decision is planned under the engine lock, the front end
makes the runtime call without it, then the plan is committed or aborted under it, so
calls for different pods run in parallel. Calls that need no decision take the runtime
call as a coroutine function and do the same around it.

What a container holds is given back only once the runtime confirms it is gone: a stop,
remove or create whose runtime call failed or was cancelled may or may not have happened,
so its grant stays until reconciliation (reconcile.py) has asked the runtime.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from resmgr.controllers import Controllers
from resmgr.engine.ledger import Ledger
from resmgr.engine.pusher import Pusher
from resmgr.engine.reconcile import SETTLE_GRACE, Reconciler, brief
from resmgr.engine.store import StateStore
from resmgr.model import (
    Adjustment,
    Container,
    ContainerEvent,
    ContainerState,
    Decision,
    Pod,
    PodState,
    Resources,
    View,
    overlay,
)
from resmgr.policies.base import Policy, PolicyError
from resmgr.topology.cpuset import CPUSet

log = logging.getLogger("cri-resmgr.engine")

T = TypeVar("T")
Call = Callable[[], Awaitable[T]]

READY_WAIT = 10.0  # how long a call waits for the first reconciliation before it is refused
START_WAIT = 10.0  # how long a start waits for the starts of containers moved off its CPUs
HOLD_BACK_MAX = 60.0  # how long starts are refused while the runtime does not take such moves


class NotReady(Exception):
    """The engine cannot decide yet: its state is not reconciled with the runtime."""


def _failure(err: BaseException) -> str:
    if isinstance(err, asyncio.CancelledError):
        return "was cancelled by the caller"
    return f"failed: {brief(err)}"


class Runtime(Protocol):
    """What the engine asks the runtime on its own behalf, in model terms (a front end adapts)."""

    async def list_pods(self) -> list[Pod]:
        """Pods as listed: ID, metadata, state (no cgroup parent yet)."""
        ...

    async def pod_details(self, pod: Pod) -> Pod:
        """A listed pod completed for adoption (cgroup parent, QoS class)."""
        ...

    async def list_containers(self, pod_id: str = "") -> list[Container]:
        """Containers as listed: ID, pod, metadata, state (no resources yet)."""
        ...

    async def container_details(self, c: Container) -> tuple[Container, list[str]]:
        """A listed container completed for adoption, and the host paths of its devices."""
        ...

    async def running_resources(self, container_id: str) -> tuple[str, str] | None:
        """The cpuset CPUs and memory nodes the runtime reports for a container."""
        ...

    async def update_resources(self, container_id: str, res: Resources) -> None: ...


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


class Changes:
    """Counts the engine's state changes, for those who follow them (the topology feed)."""

    def __init__(self) -> None:
        self.count = 0
        self._event = asyncio.Event()

    def bump(self) -> None:
        self.count += 1
        self._event.set()
        self._event = asyncio.Event()

    async def after(self, count: int) -> None:
        """Return once the count has moved past count."""
        while self.count == count:
            await self._event.wait()


class Engine:
    def __init__(self, policy: Policy, store: StateStore, runtime: Runtime,
                 controllers: Controllers | None = None, cgroup_root: str = "", gated: bool = False) -> None:
        """gated: lifecycle decisions wait for the first reconciliation (the daemon's case)."""
        self.ledger = Ledger(policy)
        self.controllers = controllers or Controllers([])
        # Device host paths -> {path: NUMA nodes}; the daemon reads sysfs, tests may stub it.
        self.device_hints: Callable[[list[str]], dict[str, list[int]]] = lambda paths: {}
        self.store = store
        self.runtime = runtime
        self.cgroup_root = cgroup_root  # where container cgroups are read back ("": not at all)
        self.lock = asyncio.Lock()
        self.reconciled = asyncio.Event()
        if not gated:
            self.reconciled.set()
        self.reconciler = Reconciler(self)
        self.pusher = Pusher(self.ledger, runtime, self.wake, brief)
        # A front end whose answers need not wait for the disk: a crash between the answer and
        # the write loses nothing, reconciliation finds the container where the answer put it.
        self.write_behind = False
        self._fallback: list[str] = []  # the policy's fallback conditions last logged
        self._held_back: dict[str, float] = {}  # starts refused since, by container
        self._saves: set[asyncio.Task[None]] = set()
        self.changes = Changes()  # bumped with every state write

    # -- state -------------------------------------------------------------
    @property
    def policy(self) -> Policy:
        return self.ledger.policy

    @property
    def pods(self) -> dict[str, Pod]:
        return self.ledger.pods

    @property
    def containers(self) -> dict[str, Container]:
        return self.ledger.containers

    def view(self) -> View:
        return self.ledger.view()

    def context(self, container_id: str) -> tuple[Pod, Container] | None:
        """A known container and its pod, as recorded (for hook plugins; not to be changed)."""
        c = self.containers.get(container_id)
        pod = self.pods.get(c.pod_id) if c is not None else None
        return None if c is None or pod is None else (pod, c)

    def pins(self, c: Container) -> bool:
        """Whether the container's CPUs and memory nodes are the policy's."""
        return self.ledger.pins(c)

    def snapshot(self) -> dict[str, Any]:
        ids = {c.key for c in self.containers.values() if c.id}
        return {
            "pods": [p.to_dict() for p in self.pods.values()],
            "containers": [c.to_dict() for c in self.containers.values() if c.id],
            "policy": {"name": self.policy.name, "data": self.policy.export_state(), "config": self.policy.config},
            "unallocated": sorted(self.ledger.unallocated & ids),
            "degraded": sorted(self.ledger.degraded & ids),
            "previous": dict(self.ledger.previous),
        }

    def restore(self, data: dict[str, Any] | None) -> None:
        """Take a persisted state (validated by resmgr.engine.statefile) as the starting point."""
        if not data:
            return
        self.ledger.load([Pod.from_dict(p) for p in data.get("pods", [])],
                         [Container.from_dict(c) for c in data.get("containers", [])],
                         data.get("unallocated", []), data.get("degraded", []), data.get("previous"))
        pdata = data.get("policy") or {}
        if pdata.get("name") == self.policy.name:
            try:
                self.policy.restore_state(pdata.get("data") or {})
                return
            except Exception as err:
                log.error("persisted %s policy data is unusable (%s); re-allocating every container",
                          self.policy.name, err)
        elif pdata.get("name"):
            log.warning("active policy changed from %s to %s; re-allocating every container",
                        pdata.get("name"), self.policy.name)
        self.ledger.unallocate_all()

    async def save(self) -> None:
        """Persist the state; with write_behind, soon, without waiting for the disk."""
        self.changes.bump()
        if not self.write_behind:
            await self.store.save(self.snapshot)
            return
        task = asyncio.create_task(self.store.save(self.snapshot))
        self._saves.add(task)
        task.add_done_callback(self._saves.discard)

    async def flush(self) -> None:
        """Persist the state now, and wait for it (at shutdown)."""
        if self._saves:
            await asyncio.gather(*self._saves, return_exceptions=True)
        await self.store.save(self.snapshot)

    async def _until_reconciled(self) -> None:
        if self.reconciled.is_set():
            return
        try:
            async with asyncio.timeout(READY_WAIT):
                await self.reconciled.wait()
        except TimeoutError:
            raise NotReady("cri-resmgr has not yet reconciled its state with the runtime (is the runtime "
                           "reachable?); try again") from None

    def release(self, c: Container) -> Decision:
        return self.ledger.release(c)

    def forget(self, c: Container) -> Decision:
        """Release c and drop it from the state (caller holds the lock)."""
        decision = self.ledger.forget(c)
        self._held_back.pop(c.key, None)
        self.pusher.forget(c.key)
        return decision

    def drop_pod(self, pod: Pod) -> Decision:
        """Forget a pod and its containers (caller holds the lock)."""
        return self.ledger.drop_pod(pod)

    def record(self, updates: dict[str, Resources]) -> None:
        """Take a decision's updates as the containers' desired resources (caller holds the lock).

        Recording under the lock, and pushing whatever is desired at push time, keeps an
        older decision from overwriting a newer one in the runtime. A recorded update is
        pending (and persisted as such) until the runtime has taken it.
        """
        self.ledger.record(updates)
        self._note_fallback()

    def _note_fallback(self) -> None:
        """Log once when containers start or stop running elsewhere than they normally would."""
        now = self.policy.fallback()
        if now == self._fallback:
            return
        for line in now:
            if line not in self._fallback:
                log.warning("%s", line)
        if self._fallback and not now:
            log.info("shared containers run on their pools' own shared CPUs again")
        self._fallback = now

    # -- pushing updates to the runtime (pusher.py) ----------------------------------------
    async def _apply_updates(self, decision: Decision) -> None:
        """Push the desired resources of the containers a decision moved (no engine lock held)."""
        await self.pusher.push_all(decision.updates)

    def _apply_soon(self, decision: Decision, before_start: str = "") -> None:
        """Push a decision's updates in the background, so the call that caused them returns now.

        They are recorded (and saved) as pending, so a crash cannot lose them.
        """
        self.pusher.soon(decision.updates, before_start)

    async def settle_updates(self) -> None:
        """Wait for the updates pushed in the background (at shutdown, in tests)."""
        await self.pusher.settle()

    # -- reconciliation (reconcile.py) ------------------------------------------------------
    def wake(self) -> None:
        """Reconcile soon: something happened whose outcome only the runtime knows."""
        self.reconciler.wake()

    async def reconcile(self) -> None:
        """One reconciliation round now."""
        await self.reconciler.reconcile()

    async def run_reconciler(self, interval: float) -> None:
        """Reconcile every interval (0: only when woken), and retry a failed round with backoff."""
        await self.reconciler.run(interval)

    # -- pod lifecycle ---------------------------------------------------------
    async def pod_created(self, pod: Pod) -> None:
        """The runtime made a pod: record it.

        An older sandbox of the same pod UID stays until the runtime shows it gone (its stop,
        its removal or a reconciliation round): a new sandbox does not prove its containers ended.
        """
        async with self.lock:
            self.ledger.add_pod(pod)
        await self.save()

    async def _call_or_wake(self, what: str, call: Call[T]) -> T:
        """The runtime call of a stop or remove; if it fails, its outcome is left to reconciliation."""
        try:
            return await call()
        except BaseException as err:
            log.warning("%s %s; what it holds stays held until the runtime shows it gone", what, _failure(err))
            self.wake()
            raise

    async def stop_pod(self, pod_id: str, call: Call[T]) -> T:
        """Stop a pod through call(); its containers give back what they hold once it is done."""
        resp = await self._call_or_wake(f"stopping pod {pod_id}", call)
        async with self.lock:
            decision = Decision()
            pod = self.pods.get(pod_id)
            if pod is not None:
                pod.state = PodState.NOT_READY
                for c in [c for c in self.containers.values() if c.pod_id == pod.id]:
                    decision.updates.update(self.release(c).updates)
            self.record(decision.updates)
        await self._apply_updates(decision)
        await self.save()
        return resp

    async def remove_pod(self, pod_id: str, call: Call[T]) -> T:
        """Remove a pod through call(); it and its containers are forgotten once it is done."""
        resp = await self._call_or_wake(f"removing pod {pod_id}", call)
        async with self.lock:
            pod = self.pods.get(pod_id)
            decision = self.drop_pod(pod) if pod is not None else Decision()
            self.record(decision.updates)
        await self._apply_updates(decision)
        await self.save()
        return resp

    # -- container creation ------------------------------------------------------
    async def plan_create(self, pod: Pod, c: Container, devices: Iterable[str] = ()) -> CreatePlan:
        """Decide where a new container goes (PolicyError, ControllerError: refused, nothing changed).

        pod is used if the engine does not know the pod yet (created while it was away).
        The front end creates the container with plan.container.resources, then calls
        commit_create or abort_create.
        """
        await self._until_reconciled()
        if c.key in self.ledger.unsettled:
            await self.reconciler.settle(c.pod_id)  # a retry: did the first attempt create it?
        await self._confirm_older(c)
        c.hints = self.device_hints(list(devices))  # sysfs reads: not under the lock
        async with self.lock:
            known = self.pods.get(c.pod_id)
            if known is None:
                known = self.ledger.add_pod(pod)
            pod = known
            self.controllers.check(c, pod)  # an annotation naming a class that does not exist
            holder = self._holder(c)
            if holder is not None:
                return self._successor_plan(pod, c, holder)
            alloc = self.ledger.place(c, pod)
            self.record(alloc.updates)
        decided = alloc.resources is not None
        return CreatePlan(pod, c, decided, alloc.updates, decided and self.policy.pins)

    async def _confirm_older(self, c: Container) -> None:
        """Ask the runtime about older containers of c's name that we hold as live: a create asking for
        a name proves nothing about them.

        Those the runtime shows ended give back what they hold. An older attempt it shows created but
        never started is one kubelet gave up on (it makes the next attempt and never starts that one,
        as its CPU manager frees the CPUs of every container that is not running): it gives back its
        grant and waits on the shared CPUs. A running one keeps its grant.
        """
        older = [o for o in self.containers.values() if o.pod_id == c.pod_id and o.name == c.name and o.id
                 and o.state != ContainerState.EXITED]
        if not older:
            return
        start_seq = self.ledger.seq
        try:
            listed = {x.id: x for x in await self.runtime.list_containers(c.pod_id)}
        except Exception as err:  # unknown: they keep their grants, reconciliation finds out
            log.warning("cannot ask the runtime whether container(s) %s still run: %s",
                        ", ".join(o.id for o in older), brief(err))
            return
        async with self.lock:
            decision = Decision()
            for o in older:
                if self.containers.get(o.key) is not o or o.seq > start_seq:
                    continue  # changed meanwhile: what we heard may be older than that
                seen = listed.get(o.id)
                if seen is not None and seen.state == ContainerState.CREATED and o.attempt < c.attempt:
                    decision.updates.update(self._supersede(o))
                else:
                    decision.updates.update(self.reconciler.ended(o, seen).updates)
            self.record(decision.updates)
        await self._apply_updates(decision)

    def _supersede(self, o: Container) -> dict[str, Resources]:
        """An older attempt that will not be started gives back its grant (caller holds the lock)."""
        pod = self.pods.get(o.pod_id)
        if pod is None:
            return {}
        try:
            decision = self.ledger.demote(o, pod)
        except PolicyError as err:
            log.error("container %s holds nothing now and stays where it is (%s)", o.id, brief(err))
            self.ledger.unallocated.add(o.key)
            return {}
        self.ledger.unallocated.discard(o.key)
        self.ledger.degraded.discard(o.key)
        log.info("container %s (%s, attempt %d) was never started and a later attempt is made: its grant is "
                 "given back and it waits on the shared CPUs", o.id, o.name, o.attempt)
        return decision.updates

    def _holder(self, c: Container) -> Container | None:
        """The container we know to hold c's runtime name (same pod, name and attempt): one being
        created, or one the runtime made that has not ended."""
        for o in self.containers.values():
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
        pinned = self.pins(holder)
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
                self.wake()  # made or not: the runtime's listing tells
            return
        if refused:
            async with self.lock:
                undo = self.forget(c) if self.containers.get(c.key) is c else Decision()
                self.ledger.deferred.pop(c.key, None)
                self.record(undo.updates)
            await self._apply_updates(undo)
            return
        self.ledger.unsettled[c.key] = time.monotonic()
        log.warning("creating container %s in pod %s %s; its grant is kept until the runtime shows whether "
                    "the container exists", c.name, plan.pod.id, _failure(err))
        self.wake()
        asyncio.get_running_loop().call_later(SETTLE_GRACE, self.wake)

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
        async with self.lock:
            pending_key = c.key
            c.id, c.state = container_id, ContainerState.CREATED
            late = self.ledger.rename(c, pending_key)
            if late is not None:  # the policy moved it while the runtime was creating it
                c.resources, c.pending = late.overlaid(c.adjusted), True
                plan.updates[c.key] = c.resources
        self._apply_soon(Decision(updates=plan.updates), before_start=c.key)
        await self.save()
        return c

    async def _commit_successor(self, plan: CreatePlan, container_id: str) -> Container:
        """The runtime made a container under a name we held for another: that one is gone (or its
        create never happened), so the new container takes over its grant."""
        c, holder = plan.container, plan.holder
        assert holder is not None
        async with self.lock:
            known = self.containers.get(container_id)
            if known is not None:  # a reconciliation round adopted it meanwhile
                return known
            c.id, c.state = container_id, ContainerState.CREATED
            if self.containers.get(holder.key) is holder and (not holder.id or holder.state != ContainerState.EXITED):
                log.info("container %s takes over the grant of %s, which held its name", c.id,
                         holder.id or "a create that did not happen")
                late = self.ledger.take_over(holder, c)
                wanted = late or holder.resources
                updates = {c.key: wanted} if wanted.overlaid(c.adjusted) != c.resources else {}
            else:  # the holder ended meanwhile: allocated like a container found running
                self.ledger.enter(c)
                self.ledger.unallocated.add(c.key)
                updates = self.reconciler.allocate_waiting()
            self.record(updates)
        self._apply_soon(Decision(updates=updates), before_start=c.key)
        await self.save()
        return c

    # -- other container calls ------------------------------------------------------
    async def adjust(self, container_id: str, res: Resources) -> None:
        """Hook plugins changed a created container's resources: push them to the runtime now."""
        async with self.lock:
            c = self.containers.get(container_id)
            if c is None or c.state == ContainerState.EXITED:
                return
            c.adjusted = overlay(c.adjusted, res)
            self.record({c.key: c.resources})
        await self.pusher.push(c.key)

    async def start_container(self, container_id: str, call: Call[T], before: bool = True) -> T:
        """Start a container through call(), once the containers its grant moved are off its CPUs.

        One we do not know was made behind our back (or by a create whose answer was lost): it is
        adopted first, so it never runs on CPUs that are someone else's. If the runtime has not
        taken the moves of the containers that must leave its CPUs (their updates failed, or were
        lost with a restart), they are pushed again, and the start is refused (NotReady) while
        any is still not confirmed. before=False: the runtime has started it already (NRI).
        """
        if before:
            if container_id not in self.containers and self.reconciled.is_set():
                await self.reconcile()
            repin = self.pusher.repins.get(container_id)
            if repin is not None:
                await asyncio.shield(repin)
            await self._clear_the_way(container_id)
        starting = self.pusher.starting
        started = starting.setdefault(container_id, asyncio.Event())
        try:
            resp = await call()
        finally:
            if container_id in self.pusher.raced:
                # Updated while the runtime was starting it: the runtime may have started it with
                # what it held before (its record says the new CPUs, its cgroup the old ones).
                await self.pusher.again(container_id)
            if starting.get(container_id) is started:
                del starting[container_id]
            started.set()
        async with self.lock:
            c = self.containers.get(container_id)
            if c is not None and c.state != ContainerState.EXITED:
                c.state = ContainerState.RUNNING
        if c is not None:
            await self.controllers_apply(c)
            await self.save()
        return resp

    async def _clear_the_way(self, container_id: str) -> None:
        c = self.containers.get(container_id)
        if c is None:
            return
        others = self._elsewhere(c)
        starting = [self.pusher.starting[k] for k in others if k in self.pusher.starting]
        if starting:  # the runtime is starting them; one updated meanwhile is updated again after
            waits = [asyncio.create_task(e.wait()) for e in starting]
            await asyncio.wait(waits, timeout=START_WAIT)
            for w in waits:
                w.cancel()
        blocking = self._unconfirmed(others)
        if blocking:
            await self.pusher.push_all(blocking)
            blocking = self._unconfirmed(blocking)
        if not blocking:
            self._held_back.pop(container_id, None)
            return
        since = self._held_back.setdefault(container_id, time.monotonic())
        names = ", ".join(k[:12] for k in blocking)
        if time.monotonic() - since < HOLD_BACK_MAX:
            raise NotReady(f"container {container_id} cannot start yet: the runtime has not taken the update "
                           f"moving container(s) {names} off its CPUs; try again")
        # A runtime that keeps refusing those updates must not keep the container from ever running.
        log.error("starting container %s although the runtime has refused for %.0f s to move container(s) %s "
                  "off its CPUs", container_id, time.monotonic() - since, names)
        self._held_back.pop(container_id, None)

    def _unconfirmed(self, keys: list[str]) -> list[str]:
        """Those of keys whose last update the runtime has not taken (gone or exited ones aside)."""
        return [k for k in keys if (o := self.containers.get(k)) is not None and o.pending
                and o.state != ContainerState.EXITED]

    def _elsewhere(self, c: Container) -> list[str]:
        """Other live containers given CPUs apart from c's: the runtime may still run one on c's CPUs
        while its update is not confirmed."""
        mine = CPUSet.parse_or_empty(c.resources.cpuset_cpus)
        if not mine:
            return []
        out = []
        for key, o in self.containers.items():
            if key == c.key or not o.id or o.state == ContainerState.EXITED:
                continue
            theirs = CPUSet.parse_or_empty(o.resources.cpuset_cpus)
            if theirs and theirs.isdisjoint(mine):
                out.append(key)
        return out

    async def plan_update(self, container_id: str, asked: Resources, plain: bool) -> UpdatePlan | None:
        """kubelet's updates: an in-place resize re-allocates; the CPU manager's cpusets never win.

        asked holds the fields the caller names (zero: keep the value; kubelet's CPU manager
        sends a cpuset alone); plain: the call carries nothing the model does not hold, so
        one that changes nothing can be answered without the runtime (plan.resources None).
        None: not a container the engine manages; the call goes to the runtime as it is.
        PolicyError: a resize that cannot be met; nothing changed.
        """
        await self._until_reconciled()
        async with self.lock:
            c = self.containers.get(container_id)
            pod = self.pods.get(c.pod_id) if c is not None else None
            if c is None or pod is None or c.state == ContainerState.EXITED:
                return None
            before = c.requested
            requested = before.merged(asked)
            resize = requested.cpu() != before.cpu() or \
                requested.memory_limit_in_bytes != before.memory_limit_in_bytes
            if resize:
                decision = self.policy.resize(c, pod, requested, self.view())
            else:
                decision = self.policy.update(c, requested, self.view())
            kept = c.adjusted.without(before.differing(requested)) if c.adjusted else None  # kubelet's word wins
            wanted = (decision.resources or requested).overlaid(kept)
            if not resize and plain and self._changes_nothing(asked, c, wanted):
                log.debug("update of container %s changes nothing; answered without the runtime", c.id)
                return UpdatePlan(c, pod, before, requested, resize, None, pinned=self.pins(c), adjusted=kept)
            self.record(decision.updates)  # pushed to the runtime once it took this one
            return UpdatePlan(c, pod, before, requested, resize, wanted, decision.updates,
                              decision.resources is not None and self.pins(c), kept)

    @staticmethod
    def _changes_nothing(asked: Resources, c: Container, wanted: Resources) -> bool:
        """Whether asking for asked would leave the container as the runtime already holds it:
        what we recorded is confirmed (not pending) and every field asked names equals it."""
        if c.pending or wanted != c.resources:
            return False
        asked = dataclasses.replace(asked, cpuset_cpus=c.resources.cpuset_cpus,
                                    cpuset_mems=c.resources.cpuset_mems)
        return c.resources.merged(asked) == c.resources

    async def abort_update(self, plan: UpdatePlan) -> None:
        """The runtime refused (or may not have taken) the update: a resize is undone."""
        if plan.resize:
            await self._undo_resize(plan.container, plan.pod, plan.before)

    async def commit_update(self, plan: UpdatePlan, sent: Resources, adjusted: Resources | None = None) -> None:
        """The runtime took sent for the container (adjusted: the fields hook plugins changed in it)."""
        c = plan.container
        async with self.lock:
            c.requested = plan.requested
            c.adjusted = overlay(plan.adjusted, adjusted)
            # Ask again: another decision may have moved this container meanwhile.
            now = self.policy.update(c, plan.requested, self.view())
            c.resources = now.resources.overlaid(c.adjusted) if now.resources else sent
            c.pending = c.resources != sent and c.state != ContainerState.EXITED
            self.ledger.apply(c, Decision(classes=now.classes))
            updates = dict(plan.moved)
            if c.pending:
                updates[c.key] = c.resources
        if plan.resize:
            log.info("container %s resized: cpu shares/quota/period %s, memory %d, cpus %s; %d other(s) moved",
                     c.id, "/".join(map(str, plan.requested.cpu())), plan.requested.memory_limit_in_bytes,
                     c.resources.cpuset_cpus or "any", len(plan.moved))
        await self._apply_updates(Decision(updates=updates))
        await self.controllers_apply(c)
        await self.save()

    async def _undo_resize(self, c: Container, pod: Pod, before: Resources) -> None:
        """Place the container as it was asked before."""
        async with self.lock:
            try:
                undo = self.policy.resize(c, pod, before, self.view())
            except Exception as err:
                log.error("undoing the resize of container %s failed: %s", c.id, brief(err))
                return
            if undo.resources is not None:
                c.resources, c.pending = undo.resources.overlaid(c.adjusted), True
                undo.updates[c.key] = c.resources
            self.record(undo.updates)
        self.wake()
        await self._apply_updates(undo)

    async def stop_container(self, container_id: str, call: Call[T]) -> T:
        """Stop a container through call(); it gives back what it holds once that is done."""
        return await self._end_container(f"stopping container {container_id}", container_id, call, forget=False)

    async def remove_container(self, container_id: str, call: Call[T]) -> T:
        """Remove a container through call(); it is forgotten once that is done."""
        return await self._end_container(f"removing container {container_id}", container_id, call, forget=True)

    async def _end_container(self, what: str, container_id: str, call: Call[T], forget: bool) -> T:
        resp = await self._call_or_wake(what, call)
        async with self.lock:
            c = self.containers.get(container_id)
            decision = Decision() if c is None else self.forget(c) if forget else self.release(c)
            self.record(decision.updates)
        self._apply_soon(decision)  # CPUs given back: nobody has to wait for that
        await self.save()  # also when an event got there first: its save may not be on disk yet
        return resp

    async def container_event(self, kind: ContainerEvent, container_id: str, pod_id: str = "") -> None:
        """A runtime event: a container that stopped or was deleted gives back what it holds.

        It stays in the state: the caller's own stop or remove, or the next reconciliation
        round, forgets it.
        """
        if not container_id or container_id == pod_id:
            return  # a pod sandbox's own event: pods hold nothing
        if kind == ContainerEvent.CREATED:
            if container_id not in self.containers and not self._creating(pod_id):
                self.wake()  # made behind our back: adopt it
            return
        if kind not in (ContainerEvent.STOPPED, ContainerEvent.DELETED):
            return
        async with self.lock:
            c = self.containers.get(container_id)
            if c is None or c.state == ContainerState.EXITED:
                return
            decision = self.release(c)
            self.record(decision.updates)
        log.debug("container %s stopped: released, %d container(s) move", c.id, len(decision.updates))
        await self._apply_updates(decision)
        await self.save()

    def _creating(self, pod_id: str) -> bool:
        """Whether one of our own creates in that pod has not returned yet."""
        return any(not c.id and (not pod_id or c.pod_id == pod_id) for c in self.containers.values())

    # -- policy and configuration --------------------------------------------------
    async def switch_policy(self, new: Policy) -> None:
        """Re-allocate every container under another policy (PolicyError: nothing changed)."""
        async with self.lock:
            old = self.policy.name
            updates = self.ledger.reallocate(new)
            log.info("policy switched from %s to %s; %d container(s) move", old, new.name, len(updates))
            self.record(updates)
        await self._apply_updates(Decision(updates=updates))
        await self.save()

    async def reconfigure(self, policy_config: dict[str, Any]) -> None:
        """Hand the policy a new configuration (PolicyError: rejected, nothing changed)."""
        async with self.lock:
            decision = self.policy.reconfigure(policy_config, self.view())
            self.record(decision.updates)
        await self._apply_updates(decision)
        await self.save()

    async def controllers_apply(self, c: Container) -> None:
        pod = self.pods.get(c.pod_id)
        if pod is not None and c.id and c.state == ContainerState.RUNNING:
            await self.controllers.apply(c, pod)

    async def reapply(self) -> None:
        """Put every running container into its classes again (after a configuration change)."""
        for c in list(self.containers.values()):
            await self.controllers_apply(c)

    async def rebalance(self) -> int:
        """Let the policy re-place containers; returns how many moved."""
        async with self.lock:
            decision = self.policy.rebalance(self.view())
            self.record(decision.updates)
        await self._apply_updates(decision)
        if decision.updates:
            await self.save()
        return len(decision.updates)
