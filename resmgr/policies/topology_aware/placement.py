"""Where a topology-aware request goes: the pools that can take it, ranked; and the grant it gets
there (exclusive CPUs sliced off the pool's shared ones, whole cores first).

The pool is chosen by filtering the pools that can take the request and ranking them: affinity,
wide enough for what a Burstable container may burst to, has all requested memory types, holds
the NUMA nodes of the container's devices, gets the preferred kind of CPU, whole cores free for an
exclusive slice, depth (the tightest fit), then as nri-plugins ranks them: for exclusive CPUs the
most capacity left, for shared ones the fewest colocated containers and then the most capacity
left; lowest pool ID last. When exclusive CPUs fit no leaf only because the free shared capacity is
spread thin, they are placed by the machine's capacity (see Placement.place).
"""

from __future__ import annotations

from dataclasses import replace

from resmgr.policies.base import PolicyError
from resmgr.policies.toolkit.allocator import Preferences, take_cpus
from resmgr.policies.toolkit.grants import Grant
from resmgr.policies.topology_aware.accounts import Accounts
from resmgr.policies.topology_aware.request import Request
from resmgr.policies.topology_aware.tree import Pool
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import MemoryType, Topology


class Placement:
    def __init__(self, accounts: Accounts, topology: Topology, isolated: CPUSet, reserved_pool: Pool | None,
                 memory_types_present: frozenset[MemoryType], one_leaf: bool) -> None:
        self.accounts, self.topology, self.isolated = accounts, topology, isolated
        self.reserved_pool, self.memory_types_present, self.one_leaf = reserved_pool, memory_types_present, one_leaf
        self._threads = max(len(core) for core in topology.cores.values())

    def fit(self, pool: Pool, r: Request) -> tuple[bool, int] | None:
        """(isolated?, capacity left) if the pool can take the request, else None."""
        if r.reserved:  # system containers always run, on the reserved CPUs, whatever the memory
            return (False, 0) if pool is self.reserved_pool else None
        if self.memory_types_present:  # without NUMA information memory is not placed at all
            if r.memory and self.accounts.memory_free(pool, r.mem_types) < r.memory:
                return None
            widest = self.accounts.pools[0].memory_of(r.mem_types)
            if r.memory_span and pool.memory_of(r.mem_types) < r.memory_span <= widest:
                return None
            if not pool.mems_of(r.mem_types):
                return None
        isolated = False
        if r.exclusive:
            free_iso = pool.isolated - self.accounts.taken
            if r.isolated and len(free_iso) >= r.exclusive:
                isolated = True
            elif any(self.accounts.spare_own(a, r.shared, r.on_shared) < r.exclusive for a in pool.ancestors[1:]) \
                    or self.accounts.spare(pool, r.shared, r.on_shared) < r.exclusive:
                return None
        if r.on_shared and not self.accounts.sharable(pool) and (r.shared or not self.accounts.shared_cpus(pool)):
            return None  # only a container asking for no CPU time may run on another pool's or reserved CPUs
        take = 0 if isolated else 1000 * r.exclusive
        left = self.accounts.shared_free(pool) - take - (r.shared if r.on_shared else 0)
        if left < 0:
            return None
        if isolated:
            return True, len(pool.isolated - self.accounts.taken) - r.exclusive
        return False, left

    def place(self, r: Request) -> Grant:
        """The grant for a request. When exclusive CPUs fit no pool, or only one that would slice them
        over several children, because the free shared capacity is spread thin over many pools (each
        keeps what its own shared containers request), they are taken from the deepest pool the
        machine's capacity allows, as kubelet's single shared pool would: the scheduler admitted the
        pod, so the node has the CPUs. The pool that lost CPUs then holds shared containers
        requesting more than its shared CPUs (a notice says so)."""
        strict: Pool | None = None
        try:
            strict = self.choose(r)
        except PolicyError:
            if not r.exclusive or r.isolated and len(self.isolated - self.accounts.taken) >= r.exclusive:
                raise
        if strict is not None and (not r.exclusive or not strict.children or not self.one_leaf):
            return self.grant(strict, r)
        # Exclusive CPUs that would be sliced over several children: one child by the machine's
        # capacity keeps them in one node or L3 domain (the container asked for whole CPUs; the
        # shared containers there make do with less for a while, as they would in kubelet's pool).
        self.accounts.relaxed = True
        try:
            relaxed = self.choose(r)
            if strict is None or relaxed.depth > strict.depth:
                return self.grant(relaxed, r)
        finally:
            self.accounts.relaxed = False
        return self.grant(strict, r)

    def choose(self, r: Request) -> Pool:
        ranked = []
        for pool in self.accounts.pools:
            fit = self.fit(pool, r)
            if fit is None:
                continue
            isolated, left = fit
            affinity = 0.0
            for key, weight in r.affinity.items():
                g = self.accounts.grants.get(key)
                if g is not None:
                    affinity += weight * pool.overlap(self.accounts.by_name[g.pool])
            all_types = not r.explicit_types or all(pool.mems.get(t) for t in r.mem_types)
            preferred_cpu = isolated == r.isolated
            mems = pool.all_mems
            hinted = sum(1 for nodes in r.hints.values() if any(n in mems for n in nodes))
            elsewhere = r.on_shared and not self.accounts.sharable(pool)  # would run on another pool's CPUs
            split = self._split(pool, r) if r.exclusive and not isolated else 0
            # The deepest pool holding where it ran before, as kubelet keeps a container's CPUs.
            sticky = -pool.depth if r.previous and r.previous <= pool.cpus else 1
            # One that gives exclusive CPUs kept for a container kubelet is to make again (View.held)
            # loses to one that need not.
            held = not isolated and self._held_short(pool, r)
            # A Burstable container goes no deeper than what it may burst to allows.
            narrow = not r.bursts_in(pool)
            # A pool it would fill exactly loses to one that keeps room, as cri-resource-manager and
            # nri-plugins rank them: the next request there could only go up the tree.
            exhausts = not isolated and left <= 0
            # As nri-plugins ranks them: exclusive CPUs where most shared capacity is left; shared ones
            # where fewest containers are, then most capacity, so they spread over the pools.
            # A pool running containers that ask for no CPU time counts 1m less, as nri-plugins has it.
            if any(self.accounts.idle[q.id] for q in pool.subtree):
                left -= 1
            spread = (-left, 0) if r.exclusive else (self.accounts.colocated[pool.id], -left)
            ranked.append(((elsewhere, sticky, held, exhausts, -affinity, narrow, not all_types, -hinted,
                            not preferred_cpu, split, -pool.depth, *spread, pool.id), pool))
        if not ranked:
            raise PolicyError(f"container {r.who}: no pool can take {r.describe() or 'it'}; free: {self.free()}")
        best = min(ranked, key=lambda x: x[0])[1]
        for _ in range(r.lift):  # prefer-shared-cpus: -N places it N pools further up
            if best.parent is None or self.fit(best.parent, r) is None:
                break
            best = best.parent
        return best

    def _held_short(self, pool: Pool, r: Request) -> bool:
        """Whether the pool's free CPUs other than those kept for others are too few for r's exclusive ones."""
        return bool(r.exclusive and r.prefer.avoid) and \
            len(self.accounts.sharable(pool) - r.prefer.avoid) < r.exclusive

    @staticmethod
    def _cold(pool: Pool, r: Request) -> bool:
        """A cold start where its pool has both DRAM and PMEM of the types it asked for (nri-plugins')."""
        return bool(r.cold) and {MemoryType.DRAM, MemoryType.PMEM} <= r.mem_types and \
            bool(pool.mems_of((MemoryType.PMEM,))) and bool(pool.mems_of((MemoryType.DRAM,)))

    def _split(self, pool: Pool, r: Request) -> int:
        """1 when the pool's shared CPUs lack the whole cores an exclusive slice needs (whole cores first)."""
        sharable = self.accounts.sharable(pool)
        whole = sum(len(core) for core in self.topology.cores.values() if core <= sharable)
        return 1 if whole < r.exclusive - r.exclusive % self._threads else 0

    def free(self) -> str:
        parts = []
        a = self.accounts
        for p in a.pools:
            mem = ", ".join(f"{a.memory_free(p, frozenset((t,))) >> 20} MiB {t}" for t in sorted(p.mems))
            parts.append(f"{p.name}: {len(a.sharable(p))} shared CPUs ({a.shared_free(p)}m unclaimed), "
                         f"{len(p.isolated - a.taken)} isolated" + (f", {mem}" if mem else ""))
        return "; ".join(parts)

    def grant(self, pool: Pool, r: Request) -> Grant:
        exclusive = EMPTY
        if r.reserved:
            return Grant(pool.name, reserved=True, milli=r.shared, memory=r.memory, mem_types=r.mem_types,
                         hide_ht=r.hide_ht, pin_cpu=r.pin_cpu, pin_memory=r.pin_memory)
        if r.exclusive:
            free_iso = pool.isolated - self.accounts.taken
            if r.isolated and len(free_iso) >= r.exclusive:
                exclusive = take_cpus(self.topology, free_iso, r.exclusive, r.prefer)
            else:
                exclusive = self.slice(pool, r.exclusive, r.prefer)
        return Grant(pool.name, exclusive, shared=r.shared if r.on_shared else 0, on_shared=r.on_shared,
                     milli=1000 * r.exclusive + r.shared, memory=r.memory, mem_types=r.mem_types, hide_ht=r.hide_ht,
                     pin_cpu=r.pin_cpu, pin_memory=r.pin_memory, cold=self._cold(pool, r),
                     irq_claim=r.irq_claim, irq_mask=r.irq_mask, irq_claim_first=r.irq_claim_first)

    def slice(self, pool: Pool, count: int, prefer: Preferences) -> CPUSet:
        """count CPUs off the pool's shared set, spread over children as their spare allows."""
        if not pool.children:
            return take_cpus(self.topology, self.accounts.sharable(pool), count, prefer)
        spare = {c.id: max(self.accounts.spare(c), 0) for c in pool.children}
        holding = [c for c in pool.children if spare[c.id] >= count]
        if holding:  # the child that holds it with the least to spare, sparing CPUs kept for others
            return self.slice(min(holding, key=lambda c: (len(self.accounts.sharable(c) - prefer.avoid) < count,
                                                         spare[c.id], c.id)), count, prefer)
        out = EMPTY
        threads = self._threads
        for whole in (True, False):  # whole cores from each child first, so no core is split between two
            for child in sorted(pool.children, key=lambda c: (-spare[c.id], c.id)):
                left = count - len(out)
                n = min(spare[child.id], left)
                if whole and n < left:
                    n -= n % threads
                if n > 0:
                    got = self.slice(child, n, prefer)
                    out |= got
                    spare[child.id] -= len(got)
                if len(out) == count:
                    return out
        return out

    def home(self, count: int, keep: tuple[CPUSet, ...]) -> CPUSet:
        """The first of keep that is count exclusive CPUs inside one leaf pool (EMPTY: none)."""
        leaves = [p.cpus for p in self.accounts.pools if not p.children]
        return next((cpus for cpus in keep if count and len(cpus) == count and any(cpus <= leaf for leaf in leaves)),
                    EMPTY)

    def keep(self, key: str, grant: Grant, keep: CPUSet) -> Grant:
        """grant with keep as its exclusive CPUs, if they are its pool's isolated or general CPUs, free,
        and leave every pool consistent; else grant as it is."""
        pool = self.accounts.by_name[grant.pool]
        if not (keep <= pool.isolated or keep <= pool.general) or not keep.isdisjoint(self.accounts.taken):
            return grant
        kept = replace(grant, exclusive=keep)
        self.accounts.grants.add(key, kept)
        problem = self.accounts.overcommitted()
        self.accounts.grants.remove(key)
        return grant if problem else kept
