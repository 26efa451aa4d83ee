"""The engine's state and what every lifecycle step shares: the ledger under one lock, its
persistence, the wait for the first reconciliation, the updates pushed to the runtime, and the
policy's switch, reconfiguration and rebalancing.

The steps of the lifecycle calls are in their own modules (create.py, start.py, update.py,
stop.py), each a part of Engine (engine.py) working on this state; reconciliation
(reconcile.py) works on this state alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from resmgr.controllers import Controllers
from resmgr.controllers.cgroups import Cpusets
from resmgr.engine import statefile
from resmgr.engine.ledger import Ledger
from resmgr.engine.pusher import Pusher
from resmgr.engine.retry import Retry
from resmgr.engine.store import StateStore
from resmgr.model import Claim, Container, ContainerState, Decision, Pod, Resources, SchedulingClass, View
from resmgr.policies.base import Policy

log = logging.getLogger("cri-resmgr.engine")

T = TypeVar("T")
Call = Callable[[], Awaitable[T]]
Hints = Callable[[list[str]], dict[str, list[int]]]

RESIZE_WAIT = 10.0  # how long a write that must hold the latest state waits for resizes under way
READY_WAIT = 10.0  # how long a call waits for the first reconciliation before it is refused
# How long a write-behind save waits for more changes: the runtime's calls for one container come
# milliseconds apart, and each write is a snapshot of every container, its JSON and an fsync.
WRITE_BEHIND = 0.05


class NotReady(Exception):
    """The engine cannot decide yet: its state is not reconciled with the runtime."""


def brief(err: BaseException) -> str:
    """One line for a failure: a gRPC error's code and details, else the exception."""
    details, code = getattr(err, "details", None), getattr(err, "code", None)
    if callable(details) and callable(code):
        return f"{code().name}: {details()}"
    return str(err) or type(err).__name__


def failure(err: BaseException) -> str:
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

    async def update_resources(self, container_id: str, res: Resources) -> None:
        """Push res; raises Stopped where the container's processes have stopped."""
        ...

    def delivering(self, container_id: str) -> bool:
        """Whether an update the runtime was given for the container is still on its way (queued,
        or sent and not yet answered): until it lands, the container runs where it was."""
        ...

    def failed_update(self, container_id: str) -> Resources | None:
        """The last update the runtime failed or refused for the container after taking it for
        delivery (NRI's UpdateContainers answers later), until one lands; None where none did."""
        ...


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


class EngineState:
    """The ledger and its lock, persistence, pushes, and the policy's own changes."""

    def __init__(self, policy: Policy, store: StateStore, runtime: Runtime, controllers: Controllers | None = None,
                 cpusets: Cpusets | None = None, gated: bool = False, device_hints: Hints | None = None,
                 write_behind: bool = False) -> None:
        """cpusets: the containers' cgroup cpusets (controllers/cgroups.py), read back by reconciliation.
        gated: lifecycle decisions wait for the first reconciliation (the daemon's case).
        device_hints: device host paths -> {path: NUMA nodes} (the daemon reads sysfs; none by default).
        write_behind: answers need not wait for the disk (see below)."""
        self.ledger = Ledger(policy)
        self.controllers = controllers or Controllers([])
        self.device_hints: Hints = device_hints or (lambda paths: {})
        self.store = store
        self.runtime = runtime
        self.cpusets = cpusets  # where containers' cpusets are read back (None: not at all)
        self.lock = asyncio.Lock()
        self.reconciled = asyncio.Event()
        if not gated:
            self.reconciled.set()
        self.woken = asyncio.Event()  # set by wake(); the reconciler waits on it
        # The node rebooted since the restored state was written: the containers the first
        # reconciliation finds ended are made again by kubelet (Ledger.await_return).
        self.rebooted = False
        self.retry = Retry(self.wake)  # what the runtime failed, tried again with backoff
        self.pusher = Pusher(self.ledger, runtime, self.retry, brief, lambda key: self.policy.shares_freely(key))
        if gated:  # a daemon's start: its first reconciliation looks before anything moves
            self.pusher.looked.clear()
        # A front end whose answers need not wait for the disk (NRI's): a crash between the answer
        # and the write loses nothing, reconciliation finds the container where the answer put it.
        self.write_behind = write_behind
        self._fallback: list[str] = []  # the policy's fallback conditions last logged
        self.held_back: dict[str, float] = {}  # starts refused since, by container
        self._saves: set[asyncio.Task[None]] = set()
        self._soon = False  # a write-behind save is waiting to start
        self._warming: set[asyncio.Task[None]] = set()  # cold starts ending
        self.changes = Changes()  # bumped with every state write
        self._before_resize: dict[str, Any] | None = None  # what is written while a resize is under way

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

    def scheduling_class(self, name: str) -> SchedulingClass | None:
        """A scheduling class of the policy in force (containers name theirs in classes["sched"])."""
        return self.policy.scheduling_class(name)

    def pins(self, c: Container) -> bool:
        """Whether the container's CPUs and memory nodes are the policy's."""
        return self.ledger.pins(c)

    def snapshot(self) -> dict[str, Any]:
        """The state to write. While a resize is under way the policy holds its decision and the
        containers it moves hold their moves, neither yet the node's: what is written then is the
        state from before it (kept_before_resize), so a crash meanwhile restarts from a whole state
        (kubelet asks for the resize again)."""
        if self.pusher.resizing and self._before_resize is not None:
            return self._before_resize
        return self._snapshot()

    async def after_resizes(self, bound: float = RESIZE_WAIT) -> None:
        """Until no resize is under way (bound seconds at most): a write meanwhile holds the state from
        before them, not what was decided since."""
        await self.pusher.after_resizes(None, "", bound)

    def kept_before_resize(self) -> None:
        """Called before a resize decision changes anything (caller holds the lock)."""
        if not self.pusher.resizing:
            self._before_resize = self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        ids = {c.key for c in self.containers.values() if c.id}
        return {
            "pods": [p.to_dict() for p in self.pods.values()],
            "containers": [c.to_dict() for c in self.containers.values() if c.id],
            "policy": {"name": self.policy.name, "data": self.policy.export_state(), "config": self.policy.config},
            "unallocated": sorted(self.ledger.unallocated & ids),
            "degraded": sorted(self.ledger.degraded & ids),
            "previous": statefile.with_vanished(self.ledger.previous, self.ledger.vanished, self.ledger.awaited),
            # Beside the policy's data, for another policy to prepare (and for 0.1.0, which reads them).
            "claims": [c.to_dict() for _, c in sorted(self.policy.prepared_claims().items())],
        }

    def restore(self, data: dict[str, Any] | None, rebooted: bool = False) -> None:
        """Take a persisted state (validated by resmgr.engine.statefile) as the starting point;
        rebooted: the node booted since it was written."""
        if not data:
            return
        self.rebooted = rebooted
        previous, vanished, awaited = statefile.split_vanished(data.get("previous") or {})
        vanished.update(data.get("vanished") or {})  # state version 2
        self.ledger.load([Pod.from_dict(p) for p in data.get("pods", [])],
                         [Container.from_dict(c) for c in data.get("containers", [])],
                         data.get("unallocated", []), data.get("degraded", []), previous, vanished,
                         awaited=awaited)
        pdata = data.get("policy") or {}
        if pdata.get("name") == self.policy.name:
            try:
                self.policy.restore_state(pdata.get("data") or {})
                self._warm_restored()
                return
            except Exception as err:
                log.error("persisted %s policy data is unusable (%s); re-allocating every container",
                          self.policy.name, err)
        elif pdata.get("name"):
            log.warning("active policy changed from %s to %s; re-allocating every container",
                        pdata.get("name"), self.policy.name)
        self.ledger.unallocate_all()
        self.ledger.reprepare(Claim.from_dict(c) for c in data.get("claims", []))

    def _warm_restored(self) -> None:
        """Cold starts a restart cut short end now (their timers went with the process): the
        memory they get is pending, pushed by the first reconciliation."""
        for key in self.policy.cold():
            self.record(self.policy.warm(key, self.view()).updates)

    async def save(self) -> None:
        """Persist the state; with write_behind, soon, without waiting for the disk."""
        self.changes.bump()
        if not self.write_behind:
            await self.store.save(self.snapshot)
            return
        if self._soon:
            return  # a save waiting to start takes this change too
        self._soon = True
        task = asyncio.create_task(self._save_soon())
        self._saves.add(task)
        task.add_done_callback(self._saves.discard)

    async def _save_soon(self) -> None:
        try:
            await asyncio.sleep(WRITE_BEHIND)
        finally:
            self._soon = False  # changes from now on need a save of their own
        await self.store.save(self.snapshot)

    def problems(self) -> list[str]:
        """What an operator should know about the engine, one line each (none while all is well)."""
        return [self.store.problem] if self.store.problem else []

    async def keep_written(self) -> None:
        """Runs for the daemon's life: the state written again once a failed write can be."""
        await self.store.keep_written()

    async def flush(self) -> None:
        """Persist the state now, and wait for it (at shutdown)."""
        if self._saves:
            await asyncio.gather(*self._saves, return_exceptions=True)
        await self.store.save(self.snapshot)

    async def until_reconciled(self) -> None:
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
        self.held_back.pop(c.key, None)
        self.pusher.forget(c.key)
        return decision

    def drop_pod(self, pod: Pod, vanished: bool = False) -> Decision:
        """Forget a pod and its containers (caller holds the lock); vanished: see Ledger.drop_pod."""
        return self.ledger.drop_pod(pod, vanished)

    def record(self, updates: dict[str, Resources]) -> None:
        """Take a decision's updates as the containers' desired resources (caller holds the lock).

        Recording under the lock, and pushing whatever is desired at push time, keeps an
        older decision from overwriting a newer one in the runtime. A recorded update is
        pending (and persisted as such) until the runtime has taken it.
        """
        self.pusher.note_held(updates)
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
    async def apply_updates(self, decision: Decision) -> None:
        """Push the desired resources of the containers a decision moved (no engine lock held)."""
        await self.pusher.push_all(decision.updates)

    def apply_soon(self, decision: Decision, before_start: str = "") -> None:
        """Push a decision's updates in the background, so the call that caused them returns now.

        They are recorded (and saved) as pending, so a crash cannot lose them.
        """
        self.pusher.soon(decision.updates, before_start)

    async def settle_updates(self) -> None:
        """Wait for the updates pushed in the background (at shutdown, in tests)."""
        await self.pusher.settle()

    def warm_later(self, key: str, seconds: float) -> None:
        """A cold start: after seconds, the policy gives the container its memory as it normally is."""
        loop = asyncio.get_running_loop()

        def start() -> None:
            task = loop.create_task(self._warm(key))
            self._warming.add(task)
            task.add_done_callback(self._warming.discard)

        loop.call_later(seconds, start)

    async def _warm(self, key: str) -> None:
        async with self.lock:
            if key not in self.containers:
                return
            decision = self.policy.warm(key, self.view())
            self.record(decision.updates)
        if decision.updates:
            log.info("container %s: cold start over, its memory on %s", key,
                     decision.updates[key].cpuset_mems if key in decision.updates else "as before")
        await self.apply_updates(decision)
        await self.save()

    def wake(self) -> None:
        """Reconcile soon: something happened whose outcome only the runtime knows."""
        self.woken.set()

    # -- policy, configuration and controllers --------------------------------------------
    async def switch_policy(self, new: Policy) -> None:
        """Re-allocate every container under another policy (PolicyError: nothing changed)."""
        async with self.lock:
            old = self.policy.name
            updates = self.ledger.reallocate(new)
            log.info("policy switched from %s to %s; %d container(s) move", old, new.name, len(updates))
            self.record(updates)
        await self.apply_updates(Decision(updates=updates))
        await self.save()

    async def reconfigure(self, policy_config: dict[str, Any]) -> None:
        """Hand the policy a new configuration (PolicyError: rejected, nothing changed)."""
        async with self.lock:
            decision = self.policy.reconfigure(policy_config, self.view())
            self.record(decision.updates)
        await self.apply_updates(decision)
        await self.save()

    async def rebalance(self) -> int:
        """Let the policy re-place containers; returns how many moved."""
        async with self.lock:
            decision = self.policy.rebalance(self.view())
            self.record(decision.updates)
        await self.apply_updates(decision)
        if decision.updates:
            await self.save()
        return len(decision.updates)

    async def controllers_apply(self, c: Container) -> None:
        pod = self.pods.get(c.pod_id)
        if pod is not None and c.id and c.state == ContainerState.RUNNING:
            await self.controllers.apply(c, pod)

    async def reapply(self) -> None:
        """Put every running container into its classes again (after a configuration change)."""
        for c in list(self.containers.values()):
            await self.controllers_apply(c)
