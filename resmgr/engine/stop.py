"""Stopping and removing pods and containers, and the runtime's container events: what a
container holds is given back once the runtime confirms it is gone."""

from __future__ import annotations

import logging

from resmgr.engine.state import Call, EngineState, T, failure
from resmgr.model import ContainerEvent, ContainerState, Decision, PodState

log = logging.getLogger("cri-resmgr.engine")


class Stop:
    def __init__(self, state: EngineState) -> None:
        self.state = state

    async def _call_or_wake(self, what: str, call: Call[T]) -> T:
        """The runtime call of a stop or remove; if it fails, its outcome is left to reconciliation."""
        try:
            return await call()
        except BaseException as err:
            log.warning("%s %s; what it holds stays held until the runtime shows it gone", what, failure(err))
            self.state.wake()
            raise

    async def stop_pod(self, pod_id: str, call: Call[T]) -> T:
        """Stop a pod through call(); its containers give back what they hold once it is done."""
        resp = await self._call_or_wake(f"stopping pod {pod_id}", call)
        async with self.state.lock:
            decision = Decision()
            pod = self.state.pods.get(pod_id)
            if pod is not None:
                pod.state = PodState.NOT_READY
                for c in [c for c in self.state.containers.values() if c.pod_id == pod.id]:
                    decision.updates.update(self.state.release(c).updates)
            self.state.record(decision.updates)
        # CPUs given back: nobody has to wait for that, and kubelet deletes the pod (and unprepares
        # its claims) only once this is answered, which a runtime stalling updates would hold up.
        self.state.apply_soon(decision)
        await self.state.save()
        return resp

    async def remove_pod(self, pod_id: str, call: Call[T]) -> T:
        """Remove a pod through call(); it and its containers are forgotten once it is done."""
        async with self.state.pusher.holding_off([pod_id]):
            resp = await self._call_or_wake(f"removing pod {pod_id}", call)
        async with self.state.lock:
            pod = self.state.pods.get(pod_id)
            decision = self.state.drop_pod(pod) if pod is not None else Decision()
            self.state.record(decision.updates)
        self.state.apply_soon(decision)  # as in stop_pod
        await self.state.save()
        return resp

    async def stop_container(self, container_id: str, call: Call[T]) -> T:
        """Stop a container through call(); it gives back what it holds once that is done."""
        return await self._end_container(f"stopping container {container_id}", container_id, call, forget=False)

    async def remove_container(self, container_id: str, call: Call[T]) -> T:
        """Remove a container through call(); it is forgotten once that is done."""
        async with self.state.pusher.holding_off([container_id]):
            return await self._end_container(f"removing container {container_id}", container_id, call, forget=True)

    async def _end_container(self, what: str, container_id: str, call: Call[T], forget: bool) -> T:
        resp = await self._call_or_wake(what, call)
        async with self.state.lock:
            c = self.state.containers.get(container_id)
            decision = Decision() if c is None else self.state.forget(c) if forget else self.state.release(c)
            self.state.record(decision.updates)
        self.state.apply_soon(decision)  # CPUs given back: nobody has to wait for that
        await self.state.save()  # also when an event got there first: its save may not be on disk yet
        return resp

    async def container_event(self, kind: ContainerEvent, container_id: str, pod_id: str = "") -> None:
        """A runtime event: a container that stopped or was deleted gives back what it holds.

        It stays in the state: the caller's own stop or remove, or the next reconciliation
        round, forgets it.
        """
        if not container_id or container_id == pod_id:
            return  # a pod sandbox's own event: pods hold nothing
        if kind == ContainerEvent.CREATED:
            if container_id not in self.state.containers and not self._creating(pod_id):
                self.state.wake()  # made behind our back: adopt it
            return
        if kind not in (ContainerEvent.STOPPED, ContainerEvent.DELETED):
            return
        async with self.state.lock:
            c = self.state.containers.get(container_id)
            if c is None or c.state == ContainerState.EXITED:
                return
            decision = self.state.release(c)
            self.state.record(decision.updates)
        log.debug("container %s stopped: released, %d container(s) move", c.id, len(decision.updates))
        await self.state.apply_updates(decision)
        await self.state.save()

    def _creating(self, pod_id: str) -> bool:
        """Whether one of our own creates in that pod has not returned yet."""
        return any(not c.id and (not pod_id or c.pod_id == pod_id) for c in self.state.containers.values())
