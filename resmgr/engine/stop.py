"""Stopping and removing pods and containers, and the runtime's container events: what a
container holds is given back once the runtime confirms it is gone."""

from __future__ import annotations

import logging

from resmgr.engine.state import Call, EngineState, T, failure
from resmgr.model import ContainerEvent, ContainerState, Decision, PodState

log = logging.getLogger("cri-resmgr.engine")


class Stopping(EngineState):
    async def _call_or_wake(self, what: str, call: Call[T]) -> T:
        """The runtime call of a stop or remove; if it fails, its outcome is left to reconciliation."""
        try:
            return await call()
        except BaseException as err:
            log.warning("%s %s; what it holds stays held until the runtime shows it gone", what, failure(err))
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
        await self.apply_updates(decision)
        await self.save()
        return resp

    async def remove_pod(self, pod_id: str, call: Call[T]) -> T:
        """Remove a pod through call(); it and its containers are forgotten once it is done."""
        resp = await self._call_or_wake(f"removing pod {pod_id}", call)
        async with self.lock:
            pod = self.pods.get(pod_id)
            decision = self.drop_pod(pod) if pod is not None else Decision()
            self.record(decision.updates)
        await self.apply_updates(decision)
        await self.save()
        return resp

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
        self.apply_soon(decision)  # CPUs given back: nobody has to wait for that
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
        await self.apply_updates(decision)
        await self.save()

    def _creating(self, pod_id: str) -> bool:
        """Whether one of our own creates in that pod has not returned yet."""
        return any(not c.id and (not pod_id or c.pod_id == pod_id) for c in self.containers.values())
