"""Machinery shared by the pool-based policies (static, static-plus).

A grant (policies/toolkit/grants.py) records what one container holds: CPUs of its own
(exclusive) and/or a place in a shared pool whose CPU set moves as exclusive grants come
and go. After every change, each container whose effective CPU set moved is reported as
an update.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from resmgr.model import Container, Pod, Resources
from resmgr.policies.base import Decision, Policy, PolicyError, View, class_names, container_requirements
from resmgr.policies.toolkit.allocator import one_thread_per_core
from resmgr.policies.toolkit.annotations import hide_hyperthreads
from resmgr.policies.toolkit.describe import pool_entry
from resmgr.policies.toolkit.grants import Grant, Grants
from resmgr.requests import Requirements, milli_to_shares
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import Topology


def grant_in(pool: str, exclusive: CPUSet = EMPTY, milli: int = 0) -> Grant:
    """A grant running on shared pool `pool` ("" for exclusive CPUs only) for a request of milli."""
    shared = max(milli - 1000 * len(exclusive), 0) if pool else 0
    return Grant(pool, exclusive, shared=shared, on_shared=bool(pool), milli=milli)


class PoolPolicy(Policy):
    def __init__(self, config: Mapping[str, Any] | None = None, topology: Topology | None = None) -> None:
        super().__init__(config, topology)
        self.require_topology()
        self.grants = Grants()

    # -- to be provided ------------------------------------------------------------------
    def pool_cpus(self) -> dict[str, CPUSet]:
        """Current CPU set of every shared pool."""
        raise NotImplementedError

    def place(self, container: Container, pod: Pod, req: Requirements) -> Grant:
        raise NotImplementedError

    def exclusive_sources(self) -> list[tuple[CPUSet, int]]:
        """The free CPU sets exclusive grants are taken from, each with how many CPUs it must keep."""
        raise NotImplementedError

    # -- common --------------------------------------------------------------------------
    def taken(self) -> CPUSet:
        """Every CPU held exclusively."""
        return self.grants.taken

    def _visible(self, g: Grant, pools: Mapping[str, CPUSet]) -> CPUSet:
        """The CPUs a grant's container runs on."""
        cpus = g.exclusive | pools.get(g.pool, EMPTY)
        return one_thread_per_core(self.topology, cpus) if g.hide_ht else cpus

    def cpus_of(self, key: str) -> CPUSet | None:
        g = self.grants.get(key)
        return None if g is None else self._visible(g, self.pool_cpus())

    def _updates(self, before: Mapping[str, CPUSet], view: View, skip: str) -> dict[str, Resources]:
        """Containers whose shared pool moved; only pools change under other containers."""
        after = self.pool_cpus()
        moved = {name for name, cpus in after.items() if before.get(name) != cpus}
        updates: dict[str, Resources] = {}
        if not moved:
            return updates
        containers = view.containers
        for key, g in self.grants.items():
            if g.pool not in moved or key == skip:
                continue
            c = containers.get(key)
            if c is not None:
                updates[key] = c.resources.with_cpus(str(self._visible(g, after)))
        return updates

    def allocate(self, container: Container, pod: Pod, view: View) -> Decision:
        return self._allocate(container, pod, view, keep=CPUSet.parse_or_empty(container.previous))

    def adopt(self, container: Container, pod: Pod, view: View) -> Decision:
        return self._allocate(container, pod, view, keep=CPUSet.parse_or_empty(container.resources.cpuset_cpus))

    def _allocate(self, container: Container, pod: Pod, view: View, keep: CPUSet) -> Decision:
        """Place the container; an exclusive grant takes the CPUs in keep instead when they would do."""
        req = container_requirements(container, pod)
        hide = bool(hide_hyperthreads(container, pod))
        before = self.pool_cpus()  # before the old grant goes: a re-allocation may free CPUs
        with self.grants.transaction():  # a failed re-allocation keeps what it had
            self.grants.remove(container.key)
            grant = self.place(container, pod, req)
            if grant.exclusive and keep != grant.exclusive and len(keep) == len(grant.exclusive):
                if any(keep <= free and len(free) - len(keep) >= spare for free, spare in self.exclusive_sources()):
                    grant = replace(grant, exclusive=keep)
            if hide:
                grant = replace(grant, hide_ht=True)
            self.grants.add(container.key, grant)
        cpus = self.cpus_of(container.key)
        classes = class_names(container, pod)
        resources = container.requested.with_cpus(str(cpus))
        resources.cpu_shares = milli_to_shares(req.cpu_request)  # the annotation may know better
        return Decision(resources=resources,
                        classes=classes,
                        updates=self._updates(before, view, container.key))

    def _snapshot(self) -> dict[str, CPUSet]:
        return self.pool_cpus()

    def _remove(self, key: str) -> Grant | None:
        return self.grants.remove(key)

    def release(self, container: Container, view: View) -> Decision:
        """The container's grant goes; the users of pools whose CPUs grow move."""
        before = self._snapshot()
        if self._remove(container.key) is None:
            return Decision()
        return Decision(updates=self._updates(before, view, container.key))

    def update(self, container: Container, requested: Resources, view: View) -> Decision:
        cpus = self.cpus_of(container.key)
        if cpus is None:
            return Decision()
        return Decision(resources=requested.with_cpus(str(cpus)))

    def resize(self, container: Container, pod: Pod, requested: Resources, view: View) -> Decision:
        held = self.grants.get(container.key)
        keep = held.exclusive if held is not None else EMPTY
        return self._allocate(replace(container, requested=requested), pod, view, keep)

    def rename(self, old_key: str, new_key: str) -> None:
        self.grants.rename(old_key, new_key)

    def pool_bases(self) -> dict[str, CPUSet]:
        """Every pool's CPUs before exclusive grants took any."""
        raise NotImplementedError

    def reserved_cpus(self) -> CPUSet:
        raise NotImplementedError

    def shared_elsewhere(self) -> dict[str, int]:
        """Pools whose shared users run on the reserved CPUs, none of the pool's own left: how many."""
        return {}

    def _source(self, g: Grant, bases: Mapping[str, CPUSet]) -> str:
        """The pool a grant counts in: its shared pool, else the one its exclusive CPUs came from."""
        if g.pool:
            return g.pool
        return next((name for name, base in bases.items() if g.exclusive and g.exclusive <= base), "")

    def describe_pools(self) -> list[dict[str, Any]]:
        assert self.topology is not None
        bases, now, reserved = self.pool_bases(), self.pool_cpus(), self.reserved_cpus()
        elsewhere = self.shared_elsewhere()
        out = []
        for name, base in bases.items():
            grants = [g for g in self.grants.values() if self._source(g, bases) == name]
            requested = sum(g.shared for g in grants if g.pool == name)
            shared = now.get(name, EMPTY) if name != "isolated" and name not in elsewhere else EMPTY
            out.append(pool_entry(self.topology, name, base, shared, reserved=base & reserved,
                                  isolated=now[name] if name == "isolated" else EMPTY,
                                  exclusive_grants=sum(1 for g in grants if g.exclusive), containers=len(grants),
                                  requested=requested, free=1000 * len(shared) - requested if shared else 0,
                                  elsewhere=elsewhere.get(name, 0)))
        return out

    def pool_of(self, key: str) -> str:
        g = self.grants.get(key)
        return "" if g is None else g.pool or "exclusive"

    def describe_grant(self, key: str) -> dict[str, Any] | None:
        g = self.grants.get(key)
        if g is None:
            return None
        kind = "mixed" if g.exclusive and g.pool else "exclusive" if g.exclusive else \
            "reserved" if g.pool == "reserved" else "shared"
        doc = {"pool": self._source(g, self.pool_bases()), "exclusive": str(g.exclusive),
               "shared_milli": g.shared, "kind": kind}
        if g.pool in self.shared_elsewhere():
            doc["fallback"] = "reserved"
        return doc

    def export_state(self) -> dict[str, Any]:
        return {"grants": {k: g.to_dict() for k, g in sorted(self.grants.items())}}

    def restore_state(self, data: Mapping[str, Any]) -> None:
        # A grant of a create still in flight when the state was saved is not restored: if the
        # runtime did create the container, reconciliation adopts and allocates it anew.
        grants = {k: Grant.from_dict(v) for k, v in (data.get("grants") or {}).items()
                  if not k.startswith("pending:")}
        online = self.topology.online
        for k, g in grants.items():
            if not g.exclusive <= online:
                raise PolicyError(f"persisted grant of {k} uses CPUs {g.exclusive - online} not online now")
        self.grants.clear()
        for k, g in grants.items():
            self.grants.add(k, g)
