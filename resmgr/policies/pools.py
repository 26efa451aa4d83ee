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

from resmgr.model import Claim, Container, Pod, Resources
from resmgr.policies.base import Decision, Policy, PolicyError, View, class_names, container_requirements, kept
from resmgr.policies.pool_devices import MODES, PoolDevices
from resmgr.policies.toolkit import claims
from resmgr.policies.toolkit.allocator import one_thread_per_core
from resmgr.policies.toolkit.annotations import hide_hyperthreads
from resmgr.policies.toolkit.describe import pool_entry
from resmgr.policies.toolkit.grants import Grant, Grants
from resmgr.policies.toolkit.options import Option
from resmgr.requests import Requirements, milli_to_shares
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import Topology

DRA_DEVICES = Option("DRADevices", "string", "numa", "the DRA devices offered (docs/dra.md): numa (one per "
                     "NUMA node), core (one per whole core) or cpu (one per CPU)", choices=MODES)


def grant_in(pool: str, exclusive: CPUSet = EMPTY, milli: int = 0) -> Grant:
    """A grant running on shared pool `pool` ("" for exclusive CPUs only) for a request of milli."""
    shared = max(milli - 1000 * len(exclusive), 0) if pool else 0
    return Grant(pool, exclusive, shared=shared, on_shared=bool(pool), milli=milli)


class PoolPolicy(Policy):
    shared_pools = True

    def __init__(self, config: Mapping[str, Any] | None = None, topology: Topology | None = None) -> None:
        super().__init__(config, topology)
        self.require_topology()
        self.grants = Grants()
        self.dra_mode = self.read_options()["DRADevices"]
        self._dra: PoolDevices | None = None

    @property
    def dra(self) -> PoolDevices:
        """The DRA devices (made at first use: the subclass knows its CPUs once its own __init__ ran)."""
        if self._dra is None:
            assert self.topology is not None
            self._dra = PoolDevices(self.topology, self.grants, self.exclusive_sources, self.exclusive_base(),
                                    self.dra_mode)
        return self._dra

    @property
    def preparing(self) -> claims.Preparing[dict[str, CPUSet]]:
        return claims.Preparing(self.dra, self.pool_cpus, self._updates)

    # -- to be provided ------------------------------------------------------------------
    def pool_cpus(self) -> dict[str, CPUSet]:
        """Current CPU set of every shared pool."""
        raise NotImplementedError

    def place(self, container: Container, pod: Pod, req: Requirements, held: CPUSet = EMPTY) -> Grant:
        """The grant for a container; exclusive CPUs none of held where enough others are free."""
        raise NotImplementedError

    def exclusive_sources(self) -> list[tuple[CPUSet, int]]:
        """The free CPU sets exclusive grants are taken from, each with how many CPUs it must keep."""
        raise NotImplementedError

    def exclusive_base(self) -> CPUSet:
        """Every CPU exclusive grants may take, before any took one."""
        raise NotImplementedError

    # -- common --------------------------------------------------------------------------
    def taken(self) -> CPUSet:
        """Every CPU held exclusively."""
        return self.grants.taken

    def _visible(self, g: Grant, pools: Mapping[str, CPUSet]) -> CPUSet:
        """The CPUs a grant's container runs on."""
        if g.claim:
            return self.dra.cpus(g.claim)
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
        return self._allocate(container, pod, view, CPUSet.parse_or_empty(container.previous))

    def adopt(self, container: Container, pod: Pod, view: View) -> Decision:
        return self._allocate(container, pod, view, *kept(container))

    def _allocate(self, container: Container, pod: Pod, view: View, *keep: CPUSet) -> Decision:
        """Place the container; an exclusive grant takes the first CPUs of keep that would do instead."""
        req = container_requirements(container, pod)
        claim = claims.claim_of(container, pod, self.dra.book.usable())
        if claim is not None:
            return self._on_claim(container, pod, req, claim, view)
        hide = bool(hide_hyperthreads(container, pod))
        before = self.pool_cpus()  # before the old grant goes: a re-allocation may free CPUs
        with self.grants.transaction():  # a failed re-allocation keeps what it had
            self.grants.remove(container.key)
            grant = self.place(container, pod, req, view.held)
            for cpus in keep:
                if grant.exclusive and len(cpus) == len(grant.exclusive) and (cpus == grant.exclusive or any(
                        cpus <= free and len(free) - len(cpus) >= spare for free, spare in self.exclusive_sources())):
                    grant = replace(grant, exclusive=cpus)
                    break
            if hide:
                grant = replace(grant, hide_ht=True)
            self.grants.add(container.key, grant)
        cpus = self.cpus_of(container.key)
        classes = class_names(container, pod)
        resources = self._unconfined(container.requested.with_cpus(str(cpus)), container)
        resources.cpu_shares = milli_to_shares(req.cpu_request)  # the annotation may know better
        return Decision(resources=resources,
                        classes=classes,
                        updates=self._updates(before, view, container.key))

    def _on_claim(self, container: Container, pod: Pod, req: Requirements, claim: Claim, view: View) -> Decision:
        """A container on a claim's CPUs; the other users of the claim get their new share of its CPU time."""
        with self.grants.transaction():
            self.grants.remove(container.key)
            self.grants.add(container.key, Grant("", milli=req.cpu_request, claim=claim.uid))
        resources = self._unconfined(container.requested.with_cpus(str(self.dra.cpus(claim.uid))), container)
        resources.cpu_shares = self._claim_shares(claim.uid)
        return Decision(resources=resources, classes=class_names(container, pod),
                        updates=self._sharers(claim.uid, view, container.key))

    def _claim_shares(self, uid: str) -> int:
        return claims.shares(len(self.dra.cpus(uid)), len(self.dra.users(uid)))

    def _sharers(self, uid: str, view: View, skip: str) -> dict[str, Resources]:
        """The claim's users but skip, with their new part of its CPU time."""
        out = {}
        for key in self.dra.users(uid):
            c = view.containers.get(key)
            if key != skip and c is not None:
                out[key] = replace(c.resources, cpu_shares=self._claim_shares(uid))
        return out

    def release(self, container: Container, view: View) -> Decision:
        """The container's grant goes; the users of pools whose CPUs grow move; a claim's other users
        get its CPU time, and an unprepared claim's CPUs go with its last user."""
        before = self.pool_cpus()
        g = self.grants.remove(container.key)
        if g is None:
            return Decision()
        if g.claim and self.dra.book.last_user_gone(g.claim, self.dra.users(g.claim)):
            self.dra.give_back(g.claim)
        updates = self._updates(before, view, container.key)
        if g.claim:
            updates.update(self._sharers(g.claim, view, container.key))
        return Decision(updates=updates)

    # -- DRA claims (docs/dra.md; pool_devices.py) -------------------------------------------
    def devices(self) -> list[dict[str, Any]]:
        return self.dra.listed()

    def prepare_claim(self, claim: Claim, view: View) -> Decision:
        return self.preparing.prepare(claim, view)

    def unprepare_claim(self, uid: str, view: View) -> Decision:
        return self.preparing.unprepare(uid, view)

    def prepared_claims(self) -> dict[str, Claim]:
        return self.dra.book.usable()

    def describe_claim(self, uid: str) -> dict[str, Any] | None:
        return self.dra.describe(uid)

    def update(self, container: Container, requested: Resources, view: View) -> Decision:
        cpus = self.cpus_of(container.key)
        if cpus is None:
            return Decision()
        return Decision(resources=self._unconfined(requested.with_cpus(str(cpus)), container))

    def _unconfined(self, res: Resources, container: Container) -> Resources:
        """These policies place CPUs only: memory on every node. A container that runs with memory
        nodes set (another policy placed them before a switch, or they came with it from the runtime:
        a lost state file, an NRI synchronization) is given every memory node by name, since the
        runtime keeps the nodes an update leaves out; any other is left to the runtime's default
        (naming nodes a generated machine has and the host has not would fail its create)."""
        if container.resources.cpuset_mems or res.cpuset_mems:
            res.cpuset_mems = str(CPUSet(n.id for n in self.topology.memory_nodes()))
        return res

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
            grants = [g for k, g in self.grants.items() if self._source(g, bases) == name and not claims.is_claim(k)]
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
        if g.claim:
            return {"pool": "", "exclusive": str(self.dra.cpus(g.claim)), "shared_milli": 0, "kind": "claim",
                    "claim": g.claim}
        kind = "mixed" if g.exclusive and g.pool else "exclusive" if g.exclusive else \
            "reserved" if g.pool == "reserved" else "shared"
        doc = {"pool": self._source(g, self.pool_bases()), "exclusive": str(g.exclusive),
               "shared_milli": g.shared, "kind": kind}
        if g.pool in self.shared_elsewhere():
            doc["fallback"] = "reserved"
        return doc

    def export_state(self) -> dict[str, Any]:
        return {"grants": {k: g.to_dict() for k, g in sorted(self.grants.items())}, **self.dra.book.export()}

    def restore_state(self, data: Mapping[str, Any]) -> None:
        # A grant of a create still in flight when the state was saved is not restored: if the
        # runtime did create the container, reconciliation adopts and allocates it anew.
        grants = {k: Grant.from_dict(v) for k, v in (data.get("grants") or {}).items()
                  if not k.startswith("pending:")}
        online = self.topology.online
        book = claims.ClaimBook()
        book.restore(data)
        for k, g in grants.items():
            if not g.exclusive <= online:
                raise PolicyError(f"persisted grant of {k} uses CPUs {g.exclusive - online} not online now")
            if g.claim and g.claim not in book.claims:
                raise PolicyError(f"grant of {k} uses claim {g.claim}, which is not prepared")
        self.grants.clear()
        for k, g in grants.items():
            self.grants.add(k, g)
        self.dra.book.restore(data)
