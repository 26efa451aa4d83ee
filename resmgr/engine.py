"""The engine: owns pod and container state, asks the policy, applies decisions.

Front ends (the CRI relay, later NRI) translate their protocol into calls here and
pass a `send` coroutine that performs the runtime call. The engine decides under
its lock, calls the runtime without it, then commits or rolls back under it, so
lifecycle calls for different pods run in parallel.

What a container holds is given back only once the runtime confirms it is gone: a stop,
remove or create whose runtime call failed or was cancelled may or may not have happened,
so its grant stays until reconciliation (reconcile.py) has asked the runtime.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

from policies import Decision, Policy, View
from resmgr.controllers import Controllers
from resmgr.cri import api_pb2 as cri
from resmgr.model import (
    Container,
    ContainerState,
    Pod,
    PodState,
    Resources,
    container_from_config,
    pod_from_config,
)
from resmgr.reconcile import Reconciling, brief
from resmgr.store import StateStore

log = logging.getLogger("cri-resmgr.engine")

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Send = Callable[[Req], Awaitable[Resp]]
Hook = Callable[[Container, Pod | None], Awaitable[None]]

HOOK_POINTS = ("pre-create", "post-create", "post-start", "pre-update", "post-update",
               "post-stop", "post-remove")

READY_WAIT = 10.0  # how long a call waits for the first reconciliation before it is refused

# Status codes (by name, so the engine needs no gRPC) meaning the runtime refused a call
# without doing anything; after any other failure the call may or may not have happened.
_REFUSALS = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED",
                       "FAILED_PRECONDITION", "OUT_OF_RANGE", "UNIMPLEMENTED", "RESOURCE_EXHAUSTED",
                       "UNAUTHENTICATED"})


class NotReady(Exception):
    """The engine cannot decide yet: its state is not reconciled with the runtime."""


def refused(err: BaseException) -> bool:
    """Whether a failed runtime call certainly changed nothing."""
    code = getattr(err, "code", None)
    code = code() if callable(code) else code
    return getattr(code, "name", None) in _REFUSALS


def _failure(err: BaseException) -> str:
    if isinstance(err, asyncio.CancelledError):
        return "was cancelled by the caller"
    return f"failed: {brief(err)}"


class Runtime(Protocol):
    """The runtime calls the engine makes on its own behalf."""

    async def version(self) -> cri.VersionResponse: ...
    async def list_pods(self) -> list[cri.PodSandbox]: ...
    async def pod_status(self, pod_id: str) -> cri.PodSandboxStatusResponse: ...
    async def list_containers(self, pod_id: str = "") -> list[cri.Container]: ...
    async def container_status(self, container_id: str, verbose: bool = True) -> cri.ContainerStatusResponse: ...
    async def update_resources(self, container_id: str, res: cri.LinuxContainerResources) -> None: ...


class Engine(Reconciling):
    def __init__(self, policy: Policy, store: StateStore, runtime: Runtime,
                 controllers: Controllers | None = None, cgroup_root: str = "", gated: bool = False) -> None:
        """gated: lifecycle decisions wait for the first reconciliation (the daemon's case)."""
        self.policy = policy
        self.controllers = controllers or Controllers([])
        # Device host paths -> {path: NUMA nodes}; the daemon reads sysfs, tests may stub it.
        self.device_hints: Callable[[list[str]], dict[str, list[int]]] = lambda paths: {}
        self.store = store
        self.runtime = runtime
        self.cgroup_root = cgroup_root  # where container cgroups are read back ("": not at all)
        self.pods: dict[str, Pod] = {}
        self.containers: dict[str, Container] = {}  # by Container.key
        self.hooks: dict[str, list[Hook]] = {p: [] for p in HOOK_POINTS}
        self._lock = asyncio.Lock()
        self._seq = 0
        self.reconciled = asyncio.Event()
        if not gated:
            self.reconciled.set()
        self._swept = False
        self._sweep_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        # Updates for containers whose create was still in flight, applied once it lands.
        self._deferred: dict[str, Resources] = {}
        # Known containers the policy holds nothing for (it changed, its data was lost, no room).
        self._unallocated: set[str] = set()
        # Containers running as plain shared ones because what they ask for did not fit.
        self._degraded: set[str] = set()
        # Pending creates whose runtime call failed or was cancelled: created or not, nobody knows yet.
        self._unsettled: set[str] = set()
        # Runtime updates: one at a time per container, a bounded number at once overall.
        self._push_locks: dict[str, asyncio.Lock] = {}
        self._push_slots = asyncio.Semaphore(16)
        # Updates pushed in the background, and those a container's start waits for.
        self._background: set[asyncio.Task[None]] = set()
        self._repins: dict[str, asyncio.Task[None]] = {}

    # -- state -------------------------------------------------------------
    def view(self) -> View:
        return View(self.pods, self.containers)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def snapshot(self) -> dict[str, Any]:
        ids = {c.key for c in self.containers.values() if c.id}
        return {
            "pods": [p.to_dict() for p in self.pods.values()],
            "containers": [c.to_dict() for c in self.containers.values() if c.id],
            "policy": {"name": self.policy.name, "data": self.policy.export_state(), "config": self.policy.config},
            "unallocated": sorted(self._unallocated & ids),
            "degraded": sorted(self._degraded & ids),
        }

    def restore(self, data: dict[str, Any] | None) -> None:
        """Take a persisted state (validated by resmgr.statefile) as the starting point."""
        if not data:
            return
        pods = [Pod.from_dict(p) for p in data.get("pods", [])]
        containers = [Container.from_dict(c) for c in data.get("containers", [])]
        self.pods = {p.id: p for p in pods}
        self.containers = {c.key: c for c in containers}
        self._seq = max([p.seq for p in pods] + [c.seq for c in containers] + [0])
        self._unallocated = set(data.get("unallocated", [])) & set(self.containers)
        self._degraded = set(data.get("degraded", [])) & set(self.containers)
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
        self._degraded.clear()
        self._unallocated = {k for k, c in self.containers.items() if c.state != ContainerState.EXITED}

    async def save(self) -> None:
        await self.store.save(self.snapshot)

    async def _run_hooks(self, point: str, container: Container, pod: Pod | None) -> None:
        for hook in self.hooks[point]:
            try:
                await hook(container, pod)
            except Exception:  # a hook must not break the lifecycle call
                log.exception("%s hook failed for container %s", point, container.key)

    def _find(self, container_id: str) -> Container | None:
        return self.containers.get(container_id)

    async def _until_reconciled(self) -> None:
        if self.reconciled.is_set():
            return
        try:
            await asyncio.wait_for(self.reconciled.wait(), READY_WAIT)
        except TimeoutError:
            raise NotReady("cri-resmgr has not yet reconciled its state with the runtime (is the runtime "
                           "reachable?); try again") from None

    def _release(self, c: Container) -> Decision:
        """Release c's resources if it still holds them (caller holds the lock)."""
        if c.state in (ContainerState.EXITED,):
            return Decision()
        decision = self.policy.release(c, self.view())
        c.state = ContainerState.EXITED
        c.pending = False
        # Newer than any reconciliation observation in flight, which may still list it running.
        c.seq = self._next_seq()
        return decision

    def _forget(self, c: Container) -> Decision:
        """Release c and drop it from the state (caller holds the lock)."""
        decision = self._release(c)
        self.containers.pop(c.key, None)
        for keys in (self._unallocated, self._degraded, self._unsettled):
            keys.discard(c.key)
        return decision

    def _record(self, updates: dict[str, Resources]) -> None:
        """Take a decision's updates as the containers' desired resources (caller holds the lock).

        Recording under the lock, and pushing whatever is desired at push time, keeps an
        older decision from overwriting a newer one in the runtime. A recorded update is
        pending (and persisted as such) until the runtime has taken it.
        """
        for key, res in updates.items():
            c = self.containers.get(key)
            if c is None:
                continue
            if not c.id:
                self._deferred[key] = res  # pushed once its create lands
            else:
                c.resources = res
                c.pending = c.state != ContainerState.EXITED

    async def _apply_updates(self, decision: Decision) -> None:
        """Push the desired resources of the containers a decision moved (no engine lock held)."""
        await self._push_all(decision.updates)

    def _apply_soon(self, decision: Decision, before_start: str = "") -> None:
        """Push a decision's updates in the background, so the call that caused them returns now.

        They are recorded (and saved) as pending, so a crash cannot lose them. The container
        before_start is not started until they are done: a new exclusive grant must not run
        while shared containers still run on its CPUs.
        """
        if not decision.updates:
            return
        task = asyncio.create_task(self._apply_updates(decision))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        if before_start:
            self._repins[before_start] = task
            task.add_done_callback(lambda t: self._repins.pop(before_start, None)
                                   if self._repins.get(before_start) is t else None)

    async def settle_updates(self) -> None:
        """Wait for the updates pushed in the background (at shutdown, in tests)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def _push_pending(self) -> None:
        await self._push_all([k for k, c in self.containers.items() if c.pending and c.id])

    async def _push_all(self, keys: Iterable[str]) -> None:
        keys = [k for k in keys if (c := self.containers.get(k)) is not None and c.id]
        if keys:
            await asyncio.gather(*(self._push(k) for k in keys))

    async def _push(self, key: str) -> None:
        lock = self._push_locks.setdefault(key, asyncio.Lock())
        async with self._push_slots, lock:
            c = self.containers.get(key)
            if c is None or not c.id or not c.pending:
                return  # gone, or an earlier push already sent the latest
            res = c.resources
            try:
                await self.runtime.update_resources(c.id, res.to_cri())
            except Exception as err:
                log.error("updating resources of container %s failed (will retry): %s", c.id, brief(err))
                self.wake()
                return
            if c.resources is res:
                c.pending = False
        if not lock.locked() and key not in self.containers:
            self._push_locks.pop(key, None)

    # -- pod lifecycle ---------------------------------------------------------
    async def run_pod_sandbox(self, req: cri.RunPodSandboxRequest,
                              send: Send) -> cri.RunPodSandboxResponse:
        resp = await send(req)
        async with self._lock:
            pod = pod_from_config(resp.pod_sandbox_id, req.config, req.runtime_handler)
            pod.seq = self._next_seq()
            stale = [p for p in self.pods.values() if p.uid == pod.uid and p.id != pod.id]
            decision = Decision()
            for old in stale:
                decision.updates.update(self._drop_pod(old).updates)
            self.pods[pod.id] = pod
            self._record(decision.updates)
        await self._apply_updates(decision)
        await self.save()
        return resp

    def _drop_pod(self, pod: Pod) -> Decision:
        decision = Decision()
        for c in [c for c in self.containers.values() if c.pod_id == pod.id]:
            decision.updates.update(self._forget(c).updates)
        self.pods.pop(pod.id, None)
        return decision

    async def _send_or_wake(self, what: str, req: Req, send: Send) -> Resp:
        """The runtime call of a stop or remove; if it fails, its outcome is left to reconciliation."""
        try:
            return await send(req)
        except BaseException as err:
            log.warning("%s %s; what it holds stays held until the runtime shows it gone", what, _failure(err))
            self.wake()
            raise

    async def stop_pod_sandbox(self, req: cri.StopPodSandboxRequest,
                               send: Send) -> cri.StopPodSandboxResponse:
        resp = await self._send_or_wake(f"StopPodSandbox {req.pod_sandbox_id}", req, send)
        async with self._lock:
            decision = Decision()
            pod = self.pods.get(req.pod_sandbox_id)
            if pod is not None:
                pod.state = PodState.NOT_READY
                for c in [c for c in self.containers.values() if c.pod_id == pod.id]:
                    decision.updates.update(self._release(c).updates)
            self._record(decision.updates)
        await self._apply_updates(decision)
        await self.save()
        return resp

    async def remove_pod_sandbox(self, req: cri.RemovePodSandboxRequest,
                                 send: Send) -> cri.RemovePodSandboxResponse:
        resp = await self._send_or_wake(f"RemovePodSandbox {req.pod_sandbox_id}", req, send)
        async with self._lock:
            pod = self.pods.get(req.pod_sandbox_id)
            decision = self._drop_pod(pod) if pod is not None else Decision()
            self._record(decision.updates)
        await self._apply_updates(decision)
        await self.save()
        return resp

    # -- container lifecycle -----------------------------------------------------
    async def create_container(self, req: cri.CreateContainerRequest,
                               send: Send) -> cri.CreateContainerResponse:
        await self._until_reconciled()
        meta = req.config.metadata
        if f"pending:{req.pod_sandbox_id}:{meta.name}:{meta.attempt}" in self._unsettled:
            await self._settle(req.pod_sandbox_id)  # a retry: did the first attempt create it?
        hints = self.device_hints([d.host_path for d in req.config.devices])  # sysfs reads: not under the lock
        async with self._lock:
            pod = self.pods.get(req.pod_sandbox_id)
            if pod is None:
                # Created before we knew about it (e.g. while reconciliation is pending).
                pod = pod_from_config(req.pod_sandbox_id, req.sandbox_config)
                pod.seq = self._next_seq()
                self.pods[pod.id] = pod
            c = container_from_config(pod.id, req.config)
            c.hints = hints
            self.controllers.check(c, pod)  # an annotation naming a class that does not exist
            c.seq = self._next_seq()
            decision = Decision()
            for old in [o for o in self.containers.values()
                        if o.pod_id == pod.id and o.name == c.name and o.key != c.key and o.id]:
                decision.updates.update(self._release(old).updates)  # re-creation
            self.containers[c.key] = c
            try:
                alloc = self.policy.allocate(c, pod, self.view())
            except BaseException:
                del self.containers[c.key]
                raise
            decision.updates.update(alloc.updates)
            self._apply_decision(c, alloc)
            self._record(decision.updates)
            if alloc.resources is not None:
                alloc.resources.to_cri(req.config.linux.resources)
        await self._run_hooks("pre-create", c, pod)
        try:
            resp = await send(req)
        except BaseException as err:
            if refused(err):
                async with self._lock:
                    undo = self._forget(c) if self.containers.get(c.key) is c else Decision()
                    self._deferred.pop(c.key, None)
                    self._record(undo.updates)
                await self._apply_updates(undo)
            else:
                # Maybe created: its CPUs stay held until the runtime is asked (a retry asks at once).
                self._unsettled.add(c.key)
                log.warning("CreateContainer %s in pod %s %s; its grant is kept until the runtime shows whether "
                            "the container exists", c.name, pod.id, _failure(err))
                self.wake()
            raise
        async with self._lock:
            pending_key = c.key
            self.containers.pop(pending_key, None)
            c.id, c.state = resp.container_id, ContainerState.CREATED
            c.seq = self._next_seq()  # known to the runtime from now on, not from when it was asked
            self.containers[c.key] = c
            self.policy.rename(pending_key, c.key)
            late = self._deferred.pop(pending_key, None)
            if late is not None:  # the policy moved it while the runtime was creating it
                c.resources, c.pending = late, True
                decision.updates[c.key] = late
        self._apply_soon(decision, before_start=c.key)
        await self._run_hooks("post-create", c, pod)
        await self.save()
        return resp

    @staticmethod
    def _apply_decision(c: Container, decision: Decision) -> None:
        if decision.resources is not None:
            c.resources = decision.resources
        c.rdt_class = decision.rdt_class or c.rdt_class
        c.blockio_class = decision.blockio_class or c.blockio_class

    async def start_container(self, req: cri.StartContainerRequest,
                              send: Send) -> cri.StartContainerResponse:
        repin = self._repins.get(req.container_id)
        if repin is not None:  # the containers its grant moved must be off its CPUs first
            await asyncio.shield(repin)
        resp = await send(req)
        async with self._lock:
            c = self._find(req.container_id)
            if c is not None and c.state != ContainerState.EXITED:
                c.state = ContainerState.RUNNING
        if c is not None:
            self._controllers_apply(c)
            await self._run_hooks("post-start", c, self.pods.get(c.pod_id))
            await self.save()
        return resp

    async def update_container_resources(self, req: cri.UpdateContainerResourcesRequest,
                                         send: Send) -> cri.UpdateContainerResourcesResponse:
        """kubelet's updates: an in-place resize re-allocates; the CPU manager's cpusets never win.

        A field the request leaves at zero keeps its value (kubelet's CPU manager sends a cpuset
        alone). A call that would change nothing the runtime holds is answered here.
        """
        await self._until_reconciled()
        async with self._lock:
            c = self._find(req.container_id)
            pod = self.pods.get(c.pod_id) if c is not None else None
            if c is None or pod is None or not req.HasField("linux") or c.state == ContainerState.EXITED:
                c = None
            else:
                before = c.requested
                requested = before.merged(Resources.from_cri(req.linux))
                resize = requested.cpu() != before.cpu() or \
                    requested.memory_limit_in_bytes != before.memory_limit_in_bytes
                if resize:  # PolicyError (RESOURCE_EXHAUSTED): the policy kept what it had
                    decision = self.policy.resize(c, pod, requested, self.view())
                else:
                    decision = self.policy.update(c, requested, self.view())
                wanted = decision.resources or requested
                if not resize and self._changes_nothing(req, c, wanted):
                    log.debug("UpdateContainerResources %s changes nothing; answered without the runtime", c.id)
                    return cri.UpdateContainerResourcesResponse()
                wanted.to_cri(req.linux)
                self._record(decision.updates)  # pushed to the runtime once it took this one
                moved, decision.updates = decision.updates, {}
        if c is None:
            return await send(req)
        await self._run_hooks("pre-update", c, pod)
        try:
            resp = await send(req)
        except BaseException:
            if resize:
                await self._undo_resize(c, pod, before)
            raise
        async with self._lock:
            c.requested = requested
            sent = Resources.from_cri(req.linux)
            # Ask again: another decision may have moved this container meanwhile.
            now = self.policy.update(c, requested, self.view())
            c.resources = now.resources or sent
            c.pending = c.resources != sent and c.state != ContainerState.EXITED
            self._apply_decision(c, Decision(rdt_class=now.rdt_class, blockio_class=now.blockio_class))
            decision.updates = dict(moved)
            if c.pending:
                decision.updates[c.key] = c.resources
        if resize:
            log.info("container %s resized: cpu shares/quota/period %s, memory %d, cpus %s; %d other(s) moved",
                     c.id, "/".join(map(str, requested.cpu())), requested.memory_limit_in_bytes,
                     c.resources.cpuset_cpus or "any", len(moved))
        await self._apply_updates(decision)
        self._controllers_apply(c)
        await self._run_hooks("post-update", c, pod)
        await self.save()
        return resp

    @staticmethod
    def _changes_nothing(req: cri.UpdateContainerResourcesRequest, c: Container, wanted: Resources) -> bool:
        """Whether forwarding req would leave the container as the runtime already holds it.

        Only when the request holds nothing but fields we model, what we recorded is confirmed
        by the runtime (not pending), and every field it names equals the applied value.
        """
        if c.pending or req.annotations or req.HasField("windows") or wanted != c.resources:
            return False
        asked = Resources.from_cri(req.linux)
        if asked.to_cri().SerializeToString(deterministic=True) != req.linux.SerializeToString(deterministic=True):
            return False  # fields we do not model (or unknown ones): the runtime must see them
        asked.cpuset_cpus, asked.cpuset_mems = c.resources.cpuset_cpus, c.resources.cpuset_mems
        return c.resources.merged(asked) == c.resources

    async def _undo_resize(self, c: Container, pod: Pod, before: Resources) -> None:
        """The runtime refused (or may not have taken) a resize: place the container as it was asked before."""
        async with self._lock:
            try:
                undo = self.policy.resize(c, pod, before, self.view())
            except Exception as err:
                log.error("undoing the resize of container %s failed: %s", c.id, brief(err))
                return
            if undo.resources is not None:
                c.resources, c.pending = undo.resources, True
                undo.updates[c.key] = undo.resources
            self._record(undo.updates)
        self.wake()
        await self._apply_updates(undo)

    async def stop_container(self, req: cri.StopContainerRequest,
                             send: Send) -> cri.StopContainerResponse:
        return await self._end_container("StopContainer", req, send, forget=False, hook="post-stop")

    async def remove_container(self, req: cri.RemoveContainerRequest,
                               send: Send) -> cri.RemoveContainerResponse:
        return await self._end_container("RemoveContainer", req, send, forget=True, hook="post-remove")

    async def _end_container(self, method: str, req: Req, send: Send, forget: bool, hook: str) -> Resp:
        """A stop or remove: what the container holds is released once the runtime confirms it."""
        resp = await self._send_or_wake(f"{method} {req.container_id}", req, send)
        async with self._lock:
            c = self._find(req.container_id)
            decision = Decision() if c is None else self._forget(c) if forget else self._release(c)
            self._record(decision.updates)
        self._apply_soon(decision)  # CPUs given back: nobody has to wait for that
        if c is not None:
            await self._run_hooks(hook, c, self.pods.get(c.pod_id))
        await self.save()  # also when an event got there first: its save may not be on disk yet
        return resp

    async def container_event(self, event: cri.ContainerEventResponse) -> None:
        """A runtime event: a container that stopped or was deleted gives back what it holds.

        It stays in the state: the caller's own StopContainer/RemoveContainer (its hooks) or the
        next reconciliation round forgets it.
        """
        kind = event.container_event_type
        if not event.container_id or event.container_id == event.pod_sandbox_status.id:
            return  # a pod sandbox's own event: pods hold nothing
        if kind == cri.CONTAINER_CREATED_EVENT:
            if event.container_id not in self.containers and not self._creating(event):
                self.wake()  # made behind our back: adopt it
            return
        if kind not in (cri.CONTAINER_STOPPED_EVENT, cri.CONTAINER_DELETED_EVENT):
            return
        async with self._lock:
            c = self._find(event.container_id)
            if c is None or c.state == ContainerState.EXITED:
                return
            decision = self._release(c)
            self._record(decision.updates)
        log.debug("container %s stopped: released, %d container(s) move", c.id, len(decision.updates))
        await self._apply_updates(decision)
        await self.save()

    def _creating(self, event: cri.ContainerEventResponse) -> bool:
        """Whether one of our own creates in that pod has not returned yet."""
        pod_id = event.pod_sandbox_status.id
        return any(not c.id and (not pod_id or c.pod_id == pod_id) for c in self.containers.values())

    async def switch_policy(self, new: Policy) -> None:
        """Re-allocate every container under another policy (PolicyError: nothing changed)."""
        async with self._lock:
            # Decide on copies, so a refusal half-way leaves the engine as it was.
            shadow = {k: dataclasses.replace(c) for k, c in self.containers.items()}
            view = View(self.pods, shadow)
            for c in self._allocation_order(shadow.values()):
                decision = new.allocate(c, self.pods[c.pod_id], view)
                self._apply_decision(c, decision)
                for key, res in decision.updates.items():
                    if key in shadow:
                        shadow[key].resources = res
            updates = {}
            for key, c in shadow.items():
                old = self.containers[key]
                if c.state != ContainerState.EXITED and c.resources != old.resources:
                    updates[key] = c.resources
                old.rdt_class, old.blockio_class = c.rdt_class, c.blockio_class
            log.info("policy switched from %s to %s; %d container(s) move", self.policy.name, new.name,
                     len(updates))
            self.policy = new
            self._unallocated.clear()
            self._degraded.clear()
            self._record(updates)
        await self._apply_updates(Decision(updates=updates))
        await self.save()

    def _allocation_order(self, containers: Iterable[Container]) -> list[Container]:
        """Live containers, Guaranteed first, then by size: big exclusive grants before the rest."""
        order = {"Guaranteed": 0, "Burstable": 1, "BestEffort": 2}
        live = [c for c in containers if c.state != ContainerState.EXITED and c.pod_id in self.pods]
        return sorted(live, key=lambda c: (order[self.pods[c.pod_id].qos_class.value],
                                           -c.requested.memory_limit_in_bytes, -c.requested.cpu_shares, c.key))

    async def reconfigure(self, policy_config: dict[str, Any]) -> None:
        """Hand the policy a new configuration (PolicyError: rejected, nothing changed)."""
        async with self._lock:
            decision = self.policy.reconfigure(policy_config, self.view())
            self._record(decision.updates)
        await self._apply_updates(decision)
        await self.save()

    def _controllers_apply(self, c: Container) -> None:
        pod = self.pods.get(c.pod_id)
        if pod is not None and c.id and c.state == ContainerState.RUNNING:
            self.controllers.apply(c, pod)

    def reapply(self) -> None:
        """Put every running container into its classes again (after a configuration change)."""
        for c in list(self.containers.values()):
            self._controllers_apply(c)

    async def rebalance(self) -> int:
        """Let the policy re-place containers; returns how many moved."""
        async with self._lock:
            decision = self.policy.rebalance(self.view())
            self._record(decision.updates)
        await self._apply_updates(decision)
        if decision.updates:
            await self.save()
        return len(decision.updates)
