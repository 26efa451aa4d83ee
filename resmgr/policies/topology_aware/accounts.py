"""topology-aware's books: the grants, and what they leave each pool of the tree.

Capacity is accounted in milli-CPU: a pool can give shared capacity only while, for it and each
of its ancestors, the shared requests granted below it fit its shared CPUs, and an exclusive slice
never leaves a pool fewer shared CPUs than its shared users request. A pool's shared CPUs are its
general CPUs minus every exclusive grant. Users that request no CPU time need none of their own:
when exclusive grants take all of a pool's shared CPUs, they run on the nearest ancestor's shared
CPUs, and when every pool's are taken, on the reserved CPUs. Memory is accounted the same way over
the pool and its ancestors.
"""

from __future__ import annotations

from resmgr.policies.toolkit.grants import Grant, Grants
from resmgr.policies.topology_aware.tree import Pool
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.model import MemoryType


class Accounts:
    def __init__(self, pools: list[Pool], reserved: CPUSet) -> None:
        self.pools = pools
        self.by_name = {p.name: p for p in pools}
        self.reserved = reserved
        self.grants = Grants(on_change=self._account)
        n = len(pools)
        self.milli = [0] * n  # shared milli-CPU granted at each pool
        self.users: list[set[str]] = [set() for _ in range(n)]  # grants on each pool's shared CPUs
        self.count = [0] * n  # grants at each pool
        self.colocated = [0] * n  # of them, those not on the reserved CPUs
        self.idle = [0] * n  # of them, shared users asking for no CPU time
        self._mem: list[dict[frozenset[MemoryType], int]] = [{} for _ in range(n)]
        self._sharable = [p.general for p in pools]
        self.relaxed = False  # placing by the machine's capacity only (see placement.py)

    def _account(self, key: str, g: Grant, sign: int) -> None:
        """Per-pool counters, kept as grants come and go (Grants calls this)."""
        pool = self.by_name[g.pool]
        self.milli[pool.id] += sign * g.shared
        self.count[pool.id] += sign
        if not g.reserved:
            self.colocated[pool.id] += sign
            if g.on_shared and not g.shared and not g.exclusive:
                self.idle[pool.id] += sign
        if g.on_shared:
            (self.users[pool.id].add if sign > 0 else self.users[pool.id].discard)(key)
        if g.memory:
            mem = self._mem[self.by_name[g.memory_pool].id]
            mem[g.mem_types] = mem.get(g.mem_types, 0) + sign * g.memory
        if g.exclusive:
            self._sharable = [p.general - self.taken for p in self.pools]

    @property
    def taken(self) -> CPUSet:
        return self.grants.taken

    def sharable(self, pool: Pool) -> CPUSet:
        """The pool's own shared CPUs: its general ones no exclusive grant holds."""
        return self._sharable[pool.id]

    def subtree_milli(self, pool: Pool) -> int:
        return sum(self.milli[q.id] for q in pool.subtree)

    def has_users(self, pool: Pool) -> bool:
        return any(self.users[q.id] for q in pool.subtree)

    def spare_own(self, pool: Pool, milli: int = 0, user: bool = False) -> int:
        """CPUs the pool's shared set can lose and still serve the shared users below it: what they
        request, and at least one while it has any (placing by the machine's capacity, users asking
        for no CPU time need none of their own where reserved CPUs can take them)."""
        users = user or self.has_users(pool)
        m = self.subtree_milli(pool) + milli
        if self.relaxed:  # only the machine's capacity counts; users asking for CPU time keep one
            keep_one = m > 0 or (users and not self.reserved)
            return len(self._sharable[pool.id]) - (1 if keep_one else 0)
        # A pool with shared users keeps a CPU of its own, as nri-plugins has it: an idle pool may be
        # sliced empty, a busy one only when nothing else fits (relaxed).
        need = max(-(-m // 1000), 1 if users else 0)
        return len(self._sharable[pool.id]) - need

    def spare(self, pool: Pool, milli: int = 0, user: bool = False) -> int:
        """CPUs an exclusive slice may take from the pool: its own spare, and what its children can give.

        milli and user are a new grant's shared part at this pool, counted before it exists.
        """
        own = self.spare_own(pool, milli, user)
        if not pool.children:
            return own
        return min(own, sum(max(self.spare(c), 0) for c in pool.children))

    def lender(self, pool: Pool) -> Pool | None:
        """The pool whose shared CPUs the pool's shared users run on: itself, once exclusive grants took
        them all the nearest ancestor that has some, and None when no pool has any (the reserved CPUs)."""
        return next((a for a in pool.ancestors if self._sharable[a.id]), None)

    def shared_cpus(self, pool: Pool) -> CPUSet:
        """Where the pool's shared users run (see lender)."""
        lender = self.lender(pool)
        return self._sharable[lender.id] if lender is not None else self.reserved

    def shared_free(self, pool: Pool) -> int:
        """Shared milli-CPU the pool can still give (min over it and its ancestors; relaxed: the machine's)."""
        scope = (self.pools[0],) if self.relaxed else pool.ancestors
        return min(1000 * len(self._sharable[a.id]) - self.subtree_milli(a) for a in scope)

    def memory_free(self, pool: Pool, types: frozenset[MemoryType]) -> int:
        """Memory a new grant of these types can still have at the pool (min over it and its ancestors).

        A grant that may use several types (DRAM and PMEM, the default) is not charged in full to
        each: the grants fit as long as, for every set S of types, those that may use only types of
        S fit S's memory (Hall's condition). A new grant of types T changes only the sets that hold
        T, so what it can have is the least room left over those."""
        free = None
        wider = [t for t in MemoryType if t not in types]
        for a in pool.ancestors:
            used: dict[frozenset[MemoryType], int] = {}
            for q in a.subtree:
                for t, v in self._mem[q.id].items():
                    used[t] = used.get(t, 0) + v
            for extra in _subsets(wider):
                s = types | extra
                left = a.memory_of(s) - sum(v for t, v in used.items() if t <= s)
                free = left if free is None else min(free, left)
        return free or 0

    def fallback(self) -> list[str]:
        """Pools whose shared users run elsewhere than on the pool's own shared CPUs, or request more
        than the pool's shared CPUs (after a relaxed placement), one line each."""
        out = []
        for pool in self.pools:
            own = self.milli[pool.id]
            if own and self._sharable[pool.id] and 1000 * len(self._sharable[pool.id]) < own:
                out.append(f"pool {pool.name}: its shared containers request {own}m on "
                           f"{len(self._sharable[pool.id])} shared CPUs (exclusive grants took CPUs to fit "
                           "pods the node had room for)")
            if self.users[pool.id] and not self._sharable[pool.id]:
                lender = self.lender(pool)
                where = f"the shared CPUs of pool {lender.name}" if lender is not None else \
                    f"the reserved CPUs {self.reserved}"
                out.append(f"exclusive grants hold every shared CPU of pool {pool.name}: its shared containers "
                           f"run on {where}")
        return out

    def overcommitted(self) -> str:
        """What is wrong with the grants as they stand ("" when nothing is): shared users without CPUs,
        or more shared CPU time granted than the machine's shared CPUs have (a pool may hold more
        than its own after a relaxed placement)."""
        for pool in self.pools:
            if self.users[pool.id] and not self.shared_cpus(pool):
                return f"pool {pool.name} has shared users and no shared CPU left"
        root = self.pools[0]
        if 1000 * len(self._sharable[root.id]) < self.subtree_milli(root):
            return (f"{self.subtree_milli(root)}m shared CPU granted, only {len(self._sharable[root.id])} "
                    "shared CPUs")
        return ""

    def claim_room(self, pool: Pool) -> int:
        """CPUs a new claim may still take from the pool (each ancestor keeping what its users need)."""
        return max(min([self.spare(pool)] + [self.spare_own(a) for a in pool.ancestors[1:]]), 0)


def _subsets(items: list[MemoryType]) -> list[frozenset[MemoryType]]:
    out = [frozenset[MemoryType]()]
    for item in items:
        out += [x | {item} for x in out]
    return out
