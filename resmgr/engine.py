"""The engine: owns pod and container state, asks the policy, applies decisions.

Front ends (the CRI relay, later NRI) translate their protocol into calls here and
pass a `send` coroutine that performs the runtime call. The engine decides under
its lock, calls the runtime without it, then commits or rolls back under it, so
lifecycle calls for different pods run in parallel.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
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
    qos_class_from_cgroup_parent,
)
from resmgr.store import StateStore

log = logging.getLogger("cri-resmgr.engine")

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Send = Callable[[Req], Awaitable[Resp]]
Hook = Callable[[Container, Pod | None], Awaitable[None]]

HOOK_POINTS = ("pre-create", "post-create", "post-start", "pre-update", "post-update",
               "post-stop", "post-remove")


class Runtime(Protocol):
    """The runtime calls the engine makes on its own behalf."""

    async def version(self) -> cri.VersionResponse: ...
    async def list_pods(self) -> list[cri.PodSandbox]: ...
    async def pod_status(self, pod_id: str) -> cri.PodSandboxStatusResponse: ...
    async def list_containers(self) -> list[cri.Container]: ...
    async def container_status(self, container_id: str) -> cri.ContainerStatusResponse: ...
    async def update_resources(self, container_id: str, res: cri.LinuxContainerResources) -> None: ...


class Engine:
    def __init__(self, policy: Policy, store: StateStore, runtime: Runtime,
                 controllers: Controllers | None = None) -> None:
        self.policy = policy
        self.controllers = controllers or Controllers([])
        # Device host paths -> {path: NUMA nodes}; the daemon reads sysfs, tests may stub it.
        self.device_hints: Callable[[list[str]], dict[str, list[int]]] = lambda paths: {}
        self.store = store
        self.runtime = runtime
        self.pods: dict[str, Pod] = {}
        self.containers: dict[str, Container] = {}  # by Container.key
        self.hooks: dict[str, list[Hook]] = {p: [] for p in HOOK_POINTS}
        self._lock = asyncio.Lock()
        self._seq = 0
        self.reconciled = asyncio.Event()
        # Updates for containers whose create was still in flight, applied once it lands.
        self._deferred: dict[str, Resources] = {}
        # Known containers the policy holds nothing for (it changed, or its data was lost).
        self._unallocated: set[str] = set()
        # Runtime updates: one at a time per container, a bounded number at once overall.
        self._push_locks: dict[str, asyncio.Lock] = {}
        self._push_slots = asyncio.Semaphore(16)

    # -- state -------------------------------------------------------------
    def view(self) -> View:
        return View(self.pods, self.containers)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def snapshot(self) -> dict[str, Any]:
        return {
            "pods": [p.to_dict() for p in self.pods.values()],
            "containers": [c.to_dict() for c in self.containers.values() if c.id],
            "policy": {"name": self.policy.name, "data": self.policy.export_state()},
        }

    def restore(self, data: dict[str, Any] | None) -> None:
        if not data:
            return
        try:
            pods = [Pod.from_dict(p) for p in data.get("pods", [])]
            containers = [Container.from_dict(c) for c in data.get("containers", [])]
        except (KeyError, TypeError, ValueError) as err:
            log.error("persisted state does not parse (%s); rebuilding from the runtime", err)
            return
        self.pods = {p.id: p for p in pods}
        self.containers = {c.key: c for c in containers}
        self._seq = max([p.seq for p in pods] + [c.seq for c in containers] + [0])
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

    def _release(self, c: Container) -> Decision:
        """Release c's resources if it still holds them (caller holds the lock)."""
        if c.state in (ContainerState.EXITED,):
            return Decision()
        decision = self.policy.release(c, self.view())
        c.state = ContainerState.EXITED
        return decision

    def _record(self, updates: dict[str, Resources]) -> None:
        """Take a decision's updates as the containers' desired resources (caller holds the lock).

        Recording under the lock, and pushing whatever is desired at push time, keeps an
        older decision from overwriting a newer one in the runtime.
        """
        for key, res in updates.items():
            c = self.containers.get(key)
            if c is None:
                continue
            if not c.id:
                self._deferred[key] = res  # pushed once its create lands
            else:
                c.resources = res

    async def _apply_updates(self, decision: Decision) -> None:
        """Push the desired resources of the containers a decision moved (no engine lock held)."""
        keys = [k for k in decision.updates if (c := self.containers.get(k)) is not None and c.id]
        if keys:
            await asyncio.gather(*(self._push(k) for k in keys))

    async def _push(self, key: str) -> None:
        lock = self._push_locks.setdefault(key, asyncio.Lock())
        async with self._push_slots, lock:
            c = self.containers.get(key)
            if c is None or not c.id or c.state == ContainerState.EXITED:
                return
            try:
                await self.runtime.update_resources(c.id, c.resources.to_cri())
            except Exception as err:
                log.error("updating resources of container %s failed: %s", c.id, err)
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
            decision.updates.update(self._release(c).updates)
            del self.containers[c.key]
        self.pods.pop(pod.id, None)
        return decision

    async def stop_pod_sandbox(self, req: cri.StopPodSandboxRequest,
                               send: Send) -> cri.StopPodSandboxResponse:
        resp = await send(req)
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
        resp = await send(req)
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
                        if o.pod_id == pod.id and o.name == c.name and o.key != c.key]:
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
        except BaseException:
            async with self._lock:
                pending = self.containers.pop(c.key, None)
                self._deferred.pop(c.key, None)
                undo = self.policy.release(pending, self.view()) if pending else Decision()
                self._record(undo.updates)
            await self._apply_updates(undo)
            raise
        async with self._lock:
            pending_key = c.key
            self.containers.pop(pending_key, None)
            c.id, c.state = resp.container_id, ContainerState.CREATED
            self.containers[c.key] = c
            self.policy.rename(pending_key, c.key)
            late = self._deferred.pop(pending_key, None)
            if late is not None:  # the policy moved it while the runtime was creating it
                c.resources = late
                decision.updates[c.key] = late
        await self._apply_updates(decision)
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
        resp = await send(req)
        async with self._lock:
            c = self._find(req.container_id)
            if c is not None:
                c.state = ContainerState.RUNNING
        if c is not None:
            self._controllers_apply(c)
            await self._run_hooks("post-start", c, self.pods.get(c.pod_id))
            await self.save()
        return resp

    async def update_container_resources(self, req: cri.UpdateContainerResourcesRequest,
                                         send: Send) -> cri.UpdateContainerResourcesResponse:
        async with self._lock:
            c = self._find(req.container_id)
            if c is not None and req.HasField("linux"):
                requested = Resources.from_cri(req.linux)
                decision = self.policy.update(c, requested, self.view())
                if decision.resources is not None:
                    decision.resources.to_cri(req.linux)
            else:
                decision = Decision()
        if c is not None:
            await self._run_hooks("pre-update", c, self.pods.get(c.pod_id))
        resp = await send(req)
        if c is not None and req.HasField("linux"):
            async with self._lock:
                c.requested = requested
                sent = Resources.from_cri(req.linux)
                # Ask again: another decision may have moved this container meanwhile.
                now = self.policy.update(c, requested, self.view())
                c.resources = now.resources or sent
                self._apply_decision(c, Decision(rdt_class=now.rdt_class, blockio_class=now.blockio_class))
                self._record(decision.updates)
                if c.resources != sent:
                    decision.updates[c.key] = c.resources
            await self._apply_updates(decision)
            self._controllers_apply(c)
            await self._run_hooks("post-update", c, self.pods.get(c.pod_id))
            await self.save()
        return resp

    async def stop_container(self, req: cri.StopContainerRequest,
                             send: Send) -> cri.StopContainerResponse:
        try:
            return await send(req)
        finally:
            # Released even when the runtime call failed: kubelet will not retry with us.
            async with self._lock:
                c = self._find(req.container_id)
                decision = self._release(c) if c is not None else Decision()
                self._record(decision.updates)
            await self._apply_updates(decision)
            if c is not None:
                await self._run_hooks("post-stop", c, self.pods.get(c.pod_id))
                await self.save()

    async def remove_container(self, req: cri.RemoveContainerRequest,
                               send: Send) -> cri.RemoveContainerResponse:
        try:
            return await send(req)
        finally:
            async with self._lock:
                c = self._find(req.container_id)
                decision = Decision()
                if c is not None:
                    decision = self._release(c)
                    del self.containers[c.key]
                self._record(decision.updates)
            await self._apply_updates(decision)
            if c is not None:
                await self._run_hooks("post-remove", c, self.pods.get(c.pod_id))
                await self.save()

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

    async def release_exited(self) -> int:
        """Release containers that exited on their own (kubelet only removes them later)."""
        exited = {c.id for c in await self.runtime.list_containers() if c.state == cri.CONTAINER_EXITED}
        async with self._lock:
            decision = Decision()
            gone = [c for c in self.containers.values() if c.id in exited and c.state != ContainerState.EXITED]
            for c in gone:
                decision.updates.update(self._release(c).updates)
            self._record(decision.updates)
        await self._apply_updates(decision)
        if gone:
            log.info("released %d container(s) that exited: %s", len(gone), ", ".join(c.id[:12] for c in gone))
            await self.save()
        return len(gone)

    # -- reconciliation ------------------------------------------------------------
    async def reconcile(self) -> None:
        """Bring the state in line with what the runtime actually runs."""
        start_seq = self._seq
        pods = await self.runtime.list_pods()
        containers = await self.runtime.list_containers()
        live_pods = {p.id: p for p in pods}
        live_ctrs = {c.id: c for c in containers}
        new_pods = {}
        for pid, p in live_pods.items():
            if pid not in self.pods:
                new_pods[pid] = await self._adopt_pod(p)
        new_ctrs = {}
        for cid, c in live_ctrs.items():
            if cid not in self.containers and c.state != cri.CONTAINER_EXITED:
                adopted = await self._adopt_container(c)
                if adopted is not None:
                    new_ctrs[cid] = adopted
        dropped_pods = dropped_ctrs = 0
        async with self._lock:
            decision = Decision()
            for pod in [p for p in self.pods.values() if p.id not in live_pods and p.seq <= start_seq]:
                decision.updates.update(self._drop_pod(pod).updates)
                dropped_pods += 1
            for c in [c for c in self.containers.values() if c.seq <= start_seq]:
                live = live_ctrs.get(c.id)
                if live is None or c.pod_id not in self.pods:
                    decision.updates.update(self._release(c).updates)
                    self.containers.pop(c.key, None)
                    dropped_ctrs += 1
                elif live.state == cri.CONTAINER_EXITED:
                    decision.updates.update(self._release(c).updates)
                elif live.state == cri.CONTAINER_RUNNING:
                    c.state = ContainerState.RUNNING
            for pid, pod in new_pods.items():
                if pid not in self.pods:
                    pod.seq = self._next_seq()
                    self.pods[pid] = pod
            for live_pod in live_pods.values():
                if live_pod.id in self.pods and live_pod.state == cri.SANDBOX_NOTREADY:
                    self.pods[live_pod.id].state = PodState.NOT_READY
            for cid, c in new_ctrs.items():
                if cid in self.containers or c.pod_id not in self.pods:
                    continue
                c.seq = self._next_seq()
                self.containers[cid] = c
                self._unallocated.add(cid)
            todo = self._allocation_order(self.containers[k] for k in self._unallocated if k in self.containers)
            self._unallocated.clear()
            for c in todo:
                try:
                    alloc = self.policy.allocate(c, self.pods[c.pod_id], self.view())
                except Exception as err:  # keep it running as it is rather than fail start-up
                    log.error("cannot allocate container %s (%s/%s): %s", c.id, c.pod_id, c.name, err)
                    continue
                self._apply_decision(c, alloc)
                decision.updates.update(alloc.updates)
                if alloc.resources is not None:
                    decision.updates[c.key] = alloc.resources
            self._record(decision.updates)
        await self._apply_updates(decision)
        self.reapply()  # containers started while we were away join their classes too
        await self.save()
        self.reconciled.set()
        log.info("reconciled with the runtime: %d pods, %d containers known; adopted %d pods, "
                 "%d containers; dropped %d pods, %d containers", len(self.pods),
                 len(self.containers), len(new_pods), len(new_ctrs), dropped_pods, dropped_ctrs)

    async def _adopt_pod(self, p: cri.PodSandbox) -> Pod:
        cgroup_parent = ""
        try:
            st = await self.runtime.pod_status(p.id)
            info = json.loads(st.info.get("info", "{}") or "{}")
            cgroup_parent = (((info.get("config") or {}).get("linux") or {}).get("cgroup_parent")
                             or "")
        except Exception as err:  # status may race with removal; adopt with what we have
            log.warning("no verbose status for pod %s: %s", p.id, err)
        return Pod(id=p.id, uid=p.metadata.uid, name=p.metadata.name,
                   namespace=p.metadata.namespace,
                   state=PodState.READY if p.state == cri.SANDBOX_READY else PodState.NOT_READY,
                   qos_class=qos_class_from_cgroup_parent(cgroup_parent),
                   cgroup_parent=cgroup_parent, labels=dict(p.labels),
                   annotations=dict(p.annotations), runtime_handler=p.runtime_handler)

    async def _adopt_container(self, c: cri.Container) -> Container | None:
        try:
            st = await self.runtime.container_status(c.id)
        except Exception as err:
            log.warning("no status for container %s, not adopting it: %s", c.id, err)
            return None
        res = Resources.from_cri(st.status.resources.linux
                                 if st.status.resources.HasField("linux") else None)
        info = json.loads(st.info.get("info", "{}") or "{}")
        config = info.get("config") or {}
        devices = [d.get("host_path", "") for d in config.get("devices") or [] if isinstance(d, dict)]
        return Container(
            id=c.id, pod_id=c.pod_sandbox_id, name=c.metadata.name, attempt=c.metadata.attempt,
            state=ContainerState.RUNNING if c.state == cri.CONTAINER_RUNNING else ContainerState.CREATED,
            image=c.image.image, command=list(config.get("command") or []),
            args=list(config.get("args") or []), labels=dict(c.labels),
            annotations=dict(c.annotations), requested=res, resources=Resources.from_dict(res.to_dict()),
            hints=self.device_hints([d for d in devices if d]),
        )
