"""Machinery shared by the pool-based policies (static, static-plus).

A grant records what one container holds: CPUs of its own (exclusive) and/or a place
in a shared pool whose CPU set moves as exclusive grants come and go. After every
change, each container whose effective CPU set moved is reported as an update.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from policies.annotations import hide_hyperthreads
from policies.base import Decision, Policy, PolicyError, View, class_names, container_requirements
from policies.toolkit.cpus import one_thread_per_core
from resmgr.model import Container, Pod, Resources
from resmgr.requests import Requirements, milli_to_shares
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import Topology


@dataclass(frozen=True)
class CPUGrant:
    pool: str  # shared pool the container runs in ("" for exclusive-only)
    exclusive: CPUSet = EMPTY
    milli: int = 0  # CPU request, for accounting
    hide_ht: bool = False  # runs on one thread of each core (hide-hyperthreads)

    @property
    def shared_milli(self) -> int:
        """The part of the request its shared pool serves (beyond its exclusive CPUs)."""
        return max(self.milli - 1000 * len(self.exclusive), 0) if self.pool else 0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"pool": self.pool, "exclusive": str(self.exclusive), "milli": self.milli}
        if self.hide_ht:
            d["hide_ht"] = True
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CPUGrant:
        return cls(str(d["pool"]), CPUSet.parse(str(d.get("exclusive", ""))), int(d.get("milli", 0)),
                   bool(d.get("hide_ht", False)))


class PoolPolicy(Policy):
    def __init__(self, config: Mapping[str, Any] | None = None, topology: Topology | None = None) -> None:
        super().__init__(config, topology)
        if topology is None:
            raise PolicyError(f"policy {self.name} needs the machine topology")
        self.grants: dict[str, CPUGrant] = {}
        self._taken = EMPTY

    # -- to be provided ------------------------------------------------------------------
    def pool_cpus(self) -> dict[str, CPUSet]:
        """Current CPU set of every shared pool."""
        raise NotImplementedError

    def place(self, container: Container, pod: Pod, req: Requirements) -> CPUGrant:
        raise NotImplementedError

    def exclusive_sources(self) -> list[tuple[CPUSet, int]]:
        """The free CPU sets exclusive grants are taken from, each with how many CPUs it must keep."""
        raise NotImplementedError

    # -- common --------------------------------------------------------------------------
    def taken(self) -> CPUSet:
        """Every CPU held exclusively (grants never overlap, so this is kept incrementally)."""
        return self._taken

    def _set_grants(self, grants: dict[str, CPUGrant]) -> None:
        self.grants = grants
        taken = EMPTY
        for g in grants.values():
            taken |= g.exclusive
        self._taken = taken

    def _visible(self, g: CPUGrant, pools: Mapping[str, CPUSet]) -> CPUSet:
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
        return self._allocate(container, pod, view, keep=EMPTY)

    def adopt(self, container: Container, pod: Pod, view: View) -> Decision:
        return self._allocate(container, pod, view, keep=CPUSet.parse_or_empty(container.resources.cpuset_cpus))

    def _allocate(self, container: Container, pod: Pod, view: View, keep: CPUSet) -> Decision:
        """Place the container; an exclusive grant takes the CPUs in keep instead when they would do."""
        req = container_requirements(container, pod)
        hide = bool(hide_hyperthreads(container, pod))
        before = self.pool_cpus()  # before the old grant goes: a re-allocation may free CPUs
        old = self.grants.pop(container.key, None)
        if old is not None:
            self._taken -= old.exclusive
        try:
            grant = self.place(container, pod, req)
        except PolicyError:
            if old is not None:  # a failed re-allocation keeps what it had
                self.grants[container.key] = old
                self._taken |= old.exclusive
            raise
        if grant.exclusive and keep != grant.exclusive and len(keep) == len(grant.exclusive):
            if any(keep <= free and len(free) - len(keep) >= spare for free, spare in self.exclusive_sources()):
                grant = replace(grant, exclusive=keep)
        if hide:
            grant = replace(grant, hide_ht=True)
        self.grants[container.key] = grant
        self._taken |= grant.exclusive
        cpus = self.cpus_of(container.key)
        rdt, blockio = class_names(container, pod)
        resources = container.requested.with_cpus(str(cpus))
        resources.cpu_shares = milli_to_shares(req.cpu_request)  # the annotation may know better
        return Decision(resources=resources,
                        rdt_class=rdt, blockio_class=blockio,
                        updates=self._updates(before, view, container.key))

    def release(self, container: Container, view: View) -> Decision:
        grant = self.grants.get(container.key)
        if grant is None:
            return Decision()
        before = self.pool_cpus()
        del self.grants[container.key]
        self._taken -= grant.exclusive
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
        if old_key in self.grants:
            self.grants[new_key] = self.grants.pop(old_key)

    def pool_bases(self) -> dict[str, CPUSet]:
        """Every pool's CPUs before exclusive grants took any."""
        raise NotImplementedError

    def reserved_cpus(self) -> CPUSet:
        raise NotImplementedError

    def shared_elsewhere(self) -> dict[str, int]:
        """Pools whose shared users run on the reserved CPUs, none of the pool's own left: how many."""
        return {}

    def _source(self, g: CPUGrant, bases: Mapping[str, CPUSet]) -> str:
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
            requested = sum(g.shared_milli for g in grants if g.pool == name)
            shared = now.get(name, EMPTY) if name != "isolated" and name not in elsewhere else EMPTY
            nodes = [n for n in self.topology.nodes.values() if n.cpus & base]
            memory: dict[str, int] = {}
            for n in nodes:
                memory[n.kind.value] = memory.get(n.kind.value, 0) + n.memory
            out.append({"name": name, "parent": "", "cpus": str(base), "shared": str(shared),
                        "shared_elsewhere": elsewhere.get(name, 0),
                        "reserved": str(base & reserved), "isolated": str(now[name]) if name == "isolated" else "",
                        "mems": str(CPUSet(n.id for n in nodes)), "memory": memory,
                        "exclusive_grants": sum(1 for g in grants if g.exclusive),
                        "containers": len(grants), "shared_milli_requested": requested,
                        "shared_milli_free": 1000 * len(shared) - requested if shared else 0})
        return out

    def describe_grant(self, key: str) -> dict[str, Any] | None:
        g = self.grants.get(key)
        if g is None:
            return None
        kind = "mixed" if g.exclusive and g.pool else "exclusive" if g.exclusive else \
            "reserved" if g.pool == "reserved" else "shared"
        doc = {"pool": self._source(g, self.pool_bases()), "exclusive": str(g.exclusive),
               "shared_milli": g.shared_milli, "kind": kind}
        if g.pool in self.shared_elsewhere():
            doc["fallback"] = "reserved"
        return doc

    def export_state(self) -> dict[str, Any]:
        return {"grants": {k: g.to_dict() for k, g in sorted(self.grants.items())}}

    def restore_state(self, data: Mapping[str, Any]) -> None:
        # A grant of a create still in flight when the state was saved is not restored: if the
        # runtime did create the container, reconciliation adopts and allocates it anew.
        grants = {k: CPUGrant.from_dict(v) for k, v in (data.get("grants") or {}).items()
                  if not k.startswith("pending:")}
        online = self.topology.online
        for k, g in grants.items():
            if not g.exclusive <= online:
                raise PolicyError(f"persisted grant of {k} uses CPUs {g.exclusive - online} not online now")
        self._set_grants(grants)
