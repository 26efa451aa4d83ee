"""The `topology-aware` policy: each container in the tightest pool of the hardware tree.

Every container gets a grant in one pool of the tree (see tree.py): reserved CPUs
(kube-system and containers asking for them), exclusive CPUs (kernel-isolated or sliced
off the pool's shared CPUs) and/or a share of the pool's shared CPUs, and the pool's
memory nodes of the requested memory types. A pool's shared CPUs are its general CPUs
minus every exclusive grant, so they shrink and grow as exclusive grants come and go,
and every shared user of a pool is re-pinned when they do.

Capacity is accounted in milli-CPU: a pool can give shared capacity only while, for it
and each of its ancestors, the shared requests granted below it fit its shared CPUs, and
an exclusive slice never leaves a pool fewer shared CPUs than its shared users request.
Users that request no CPU time (best-effort) need none of their own: when exclusive grants
take all of a pool's shared CPUs, they run on the nearest ancestor's shared CPUs, and
when every pool's are taken, on the reserved CPUs, as kubelet's shared pool does; they
move back as soon as shared CPUs come free. Without reserved CPUs a pool with shared
users always keeps one shared CPU (an empty cpuset would mean any CPU). Memory
is accounted the same way over the pool and its ancestors; a grant whose memory no
longer fits where it is has its memory widened to the nearest pool up the tree where it
does.

The pool is chosen by filtering the pools that can take the request and ranking them:
affinity, wide enough for what a Burstable container may burst to (CPUs enough for its CPU
limit; without one, no deeper than UnlimitedBurstable), has all requested memory types, holds
the NUMA nodes of the container's devices, gets the preferred kind of CPU, whole cores free
for an exclusive slice, depth (the tightest fit), then as nri-plugins ranks them: for
exclusive CPUs the most capacity left, for shared ones the fewest colocated containers and
then the most capacity left; lowest pool ID last. When exclusive CPUs fit
no leaf only because the free shared capacity is spread thin, they are placed by the
machine's capacity (see _place).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from resmgr.model import Claim, Container, Pod, QOSClass, Resources
from resmgr.policies.base import Decision, Policy, PolicyError, View, class_names, container_requirements
from resmgr.policies.toolkit import annotations, claims, cpuvalues
from resmgr.policies.toolkit.allocator import ANY, Preferences, one_thread_per_core, preferences, take_cpus
from resmgr.policies.toolkit.describe import pool_entry
from resmgr.policies.toolkit.grants import Grant, Grants
from resmgr.policies.toolkit.options import Option, in_namespaces, reserved_namespaces
from resmgr.policies.topology_aware.affinity import affinities
from resmgr.policies.topology_aware.tree import Pool, TreeError, build, devices, owner
from resmgr.requests import Requirements, milli_to_shares
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import MemoryType, Topology

# nri-plugins' CPU topology levels, widest first (a pool's level: tree.Pool.level).
LEVELS = ("system", "package", "die", "numa")
UNLIMITED_BURSTABLE = "unlimited-burstable"

OPTIONS = (
    Option("PinCPU", "boolean", True, "write the containers' cpusets"),
    Option("PinMemory", "boolean", True, "write the containers' memory nodes"),
    Option("PreferIsolatedCPUs", "boolean", True, "1-CPU exclusive requests on kernel-isolated CPUs"),
    Option("PreferSharedCPUs", "boolean", False, "every container on shared CPUs"),
    Option("ReservedPoolNamespaces", "strings", None, "namespaces (globs) on the reserved CPUs besides "
           "kube-system, which always is (policy.ReservedPoolNamespaces wins)"),
    Option("ColocatePods", "boolean", False, "a pod's containers in the same pool"),
    Option("ColocateNamespaces", "boolean", False, "a namespace's containers in the same pool"),
    Option("ExclusiveInOneLeaf", "boolean", True, "exclusive CPUs no leaf can give by its own accounting come "
           "from one leaf by the machine's capacity (its shared containers run on the parent's shared CPUs "
           "meanwhile); false: sliced over several leaves of a parent, as nri-plugins does"),
    Option("UnlimitedBurstable", "string", "package", "the widest pool a Burstable container without a CPU "
           "limit may go to (system, package, die or numa; the unlimited-burstable annotation overrides it)",
           choices=LEVELS),
)


@dataclass
class Request:
    """What one container asks of a pool."""

    who: str
    exclusive: int = 0  # whole CPUs to hold exclusively
    shared: int = 0  # milli-CPU from the shared CPUs
    on_shared: bool = True
    reserved: bool = False
    isolated: bool = False  # exclusive CPUs preferably from the isolated ones
    memory: int = 0  # accounted
    memory_span: int = 0  # a Burstable container's memory limit, above what is accounted: pools that wide
    mem_types: frozenset[MemoryType] = annotations.DEFAULT_MEMORY
    explicit_types: bool = False  # asked for by annotation: pools having them all rank higher
    lift: int = 0  # pools above the best fit (prefer-shared-cpus: -N)
    hints: dict[str, list[int]] = field(default_factory=dict)  # device -> its NUMA nodes
    affinity: dict[str, float] = field(default_factory=dict)  # container key -> weight
    prefer: Preferences = ANY  # what kind of exclusive CPUs
    hide_ht: bool = False
    previous: CPUSet = EMPTY  # where the pod's container of this name ran before: its pool first
    burst_limit: int = 0  # a Burstable container's CPU limit (milli): pools with that many CPUs first
    burst_level: int | None = None  # a Burstable container without one: pools this wide or wider first

    def bursts_in(self, pool: Pool) -> bool:
        """Whether the pool is wide enough for what the container may burst to: CPUs enough for its
        limit (reserved ones counted, as nri-plugins counts them), or the level it may go to."""
        if self.burst_level is not None:
            return pool.level <= self.burst_level or pool.parent is None
        return 1000 * len(pool.cpus) >= self.burst_limit

    def describe(self) -> str:
        parts = []
        if self.reserved:
            parts.append("reserved CPUs")
        if self.exclusive:
            parts.append(f"{self.exclusive} exclusive CPU(s)" + (" (isolated preferred)" if self.isolated else ""))
        if self.on_shared and not self.reserved:
            parts.append(f"{self.shared}m shared CPU")
        if self.memory:
            parts.append(f"{self.memory >> 20} MiB of {'/'.join(sorted(self.mem_types))} memory")
        return ", ".join(parts)


class TopologyAwarePolicy(claims.ClaimHolder, Policy):
    name = "topology-aware"
    description = ("pools from the hardware tree (sockets, dies, NUMA nodes, L3): each container in the tightest "
                   "pool that fits, with CPUs and memory from the same place")
    options = OPTIONS

    def __init__(self, config: Mapping[str, Any] | None = None, topology: Topology | None = None) -> None:
        super().__init__(config, topology)
        self.require_topology()
        options = self.read_options()
        self.pin_cpu, self.pin_memory = options["PinCPU"], options["PinMemory"]
        self.prefer_isolated, self.prefer_shared = options["PreferIsolatedCPUs"], options["PreferSharedCPUs"]
        self.colocate_pods, self.colocate_namespaces = options["ColocatePods"], options["ColocateNamespaces"]
        self.unlimited_burstable = LEVELS.index(options["UnlimitedBurstable"])
        self.one_leaf = options["ExclusiveInOneLeaf"]
        self.reserved_namespaces = reserved_namespaces(
            self.config.get("ReservedPoolNamespaces", options["ReservedPoolNamespaces"]))

        cpus = cpuvalues.resolve_cpus(self.config, topology)
        available, isolated, reserved = cpus.available, cpus.isolated, cpus.reserved
        if not available - isolated - reserved:
            raise PolicyError(f"{self.name}: no CPUs left to share (available {available}, isolated "
                              f"{isolated or 'none'}, reserved {reserved or 'none'})")
        try:
            self.pools = build(topology, available, isolated, reserved)
        except TreeError as err:
            raise PolicyError(f"{self.name}: {err}") from None
        self.by_name = {p.name: p for p in self.pools}
        self.available, self.isolated, self.reserved = available, isolated, reserved
        self.reserved_pool = owner(self.pools, reserved) if reserved else None
        self.memory_types_present = frozenset(self.pools[0].mems)
        self.grants = Grants(on_change=self._account)
        n = len(self.pools)
        self._milli = [0] * n  # shared milli-CPU granted at each pool
        self._users: list[set[str]] = [set() for _ in range(n)]  # grants on each pool's shared CPUs
        self._count = [0] * n  # grants at each pool
        self._colocated = [0] * n  # of them, those not on the reserved CPUs
        self._idle = [0] * n  # of them, shared users asking for no CPU time
        self._mem: list[dict[frozenset[MemoryType], int]] = [{} for _ in range(n)]
        self._sharable = [p.general for p in self.pools]
        self._relaxed = False  # placing by the machine's capacity only (see _place)
        self._threads = max(len(core) for core in topology.cores.values())
        # DRA: the devices offered (NUMA nodes, L3 domains), the claims prepared on them, and those
        # unprepared while containers still run on their CPUs (given back when the last one goes).
        self.dra = devices(topology, self.pools)
        self.claims: dict[str, Claim] = {}
        self.unprepared: set[str] = set()

    # -- accounting ------------------------------------------------------------------------
    @property
    def _taken(self) -> CPUSet:
        return self.grants.taken

    def _account(self, key: str, g: Grant, sign: int) -> None:
        """Per-pool counters, kept as grants come and go (Grants calls this)."""
        pool = self.by_name[g.pool]
        self._milli[pool.id] += sign * g.shared
        self._count[pool.id] += sign
        if not g.reserved:
            self._colocated[pool.id] += sign
            if g.on_shared and not g.shared and not g.exclusive:
                self._idle[pool.id] += sign
        if g.on_shared:
            (self._users[pool.id].add if sign > 0 else self._users[pool.id].discard)(key)
        if g.memory:
            mem = self._mem[self.by_name[g.memory_pool].id]
            mem[g.mem_types] = mem.get(g.mem_types, 0) + sign * g.memory
        if g.exclusive:
            self._sharable = [p.general - self._taken for p in self.pools]

    def _add(self, key: str, g: Grant) -> None:
        self.grants.add(key, g)

    def _remove(self, key: str) -> Grant | None:
        return self.grants.remove(key)

    def sharable(self, pool: Pool) -> CPUSet:
        return self._sharable[pool.id]

    def _subtree_milli(self, pool: Pool) -> int:
        return sum(self._milli[q.id] for q in pool.subtree)

    def _has_users(self, pool: Pool) -> bool:
        return any(self._users[q.id] for q in pool.subtree)

    def _spare_own(self, pool: Pool, milli: int = 0, user: bool = False) -> int:
        """CPUs the pool's shared set can lose and still serve the shared users below it: what they
        request, and at least one while it has any (placing by the machine's capacity, users asking
        for no CPU time need none of their own where reserved CPUs can take them)."""
        users = user or self._has_users(pool)
        m = self._subtree_milli(pool) + milli
        if self._relaxed:  # only the machine's capacity counts (see _place); users asking for CPU time keep one
            keep_one = m > 0 or (users and not self.reserved)
            return len(self._sharable[pool.id]) - (1 if keep_one else 0)
        # A pool with shared users keeps a CPU of its own, as nri-plugins has it: an idle pool may be
        # sliced empty, a busy one only when nothing else fits (relaxed).
        need = max(-(-m // 1000), 1 if users else 0)
        return len(self._sharable[pool.id]) - need

    def _lender(self, pool: Pool) -> Pool | None:
        """The pool whose shared CPUs the pool's shared users run on: itself, once exclusive grants took
        them all the nearest ancestor that has some, and None when no pool has any (the reserved CPUs)."""
        return next((a for a in pool.ancestors if self._sharable[a.id]), None)

    def shared_cpus(self, pool: Pool) -> CPUSet:
        """Where the pool's shared users run (see _lender)."""
        lender = self._lender(pool)
        return self._sharable[lender.id] if lender is not None else self.reserved

    def fallback(self) -> list[str]:
        """Pools whose shared users run elsewhere than on the pool's own shared CPUs, or request more
        than the pool's shared CPUs (after a relaxed placement), one line each."""
        out = []
        for pool in self.pools:
            own = self._milli[pool.id]
            if own and self._sharable[pool.id] and 1000 * len(self._sharable[pool.id]) < own:
                out.append(f"pool {pool.name}: its shared containers request {own}m on "
                           f"{len(self._sharable[pool.id])} shared CPUs (exclusive grants took CPUs to fit "
                           "pods the node had room for)")
            if self._users[pool.id] and not self._sharable[pool.id]:
                lender = self._lender(pool)
                where = f"the shared CPUs of pool {lender.name}" if lender is not None else \
                    f"the reserved CPUs {self.reserved}"
                out.append(f"exclusive grants hold every shared CPU of pool {pool.name}: its shared containers "
                           f"run on {where}")
        return out

    def _spare(self, pool: Pool, milli: int = 0, user: bool = False) -> int:
        """CPUs an exclusive slice may take from the pool: its own spare, and what its children can give.

        milli and user are a new grant's shared part at this pool, counted before it exists.
        """
        own = self._spare_own(pool, milli, user)
        if not pool.children:
            return own
        return min(own, sum(max(self._spare(c), 0) for c in pool.children))

    def _shared_free(self, pool: Pool) -> int:
        """Shared milli-CPU the pool can still give (min over it and its ancestors; relaxed: the machine's)."""
        scope = (self.pools[0],) if self._relaxed else pool.ancestors
        return min(1000 * len(self._sharable[a.id]) - self._subtree_milli(a) for a in scope)

    def _memory_free(self, pool: Pool, types: frozenset[MemoryType]) -> int:
        free = None
        for a in pool.ancestors:
            used = sum(v for q in a.subtree for t, v in self._mem[q.id].items() if t & types)
            left = a.memory_of(types) - used
            free = left if free is None else min(free, left)
        return free or 0

    # -- choosing a pool ----------------------------------------------------------------
    def _request(self, container: Container, pod: Pod, req: Requirements, view: View) -> Request:
        who = f"{pod.namespace}/{pod.name}/{container.name}"
        types = annotations.memory_types(container, pod)
        if types is not None and self.memory_types_present and not types & self.memory_types_present:
            raise PolicyError(f"container {who}: asks for {'/'.join(sorted(types))} memory; this machine has "
                              f"{'/'.join(sorted(self.memory_types_present))}")
        # A Burstable container's memory is accounted by its request, where known (the webhook's
        # annotation), and its pool must be wide enough for its limit, as nri-plugins has it.
        by_request = req.qos == QOSClass.BURSTABLE and req.memory_request > 0
        r = Request(who, memory=req.memory_request if by_request else req.memory_limit or req.memory_request,
                    memory_span=req.memory_limit if by_request and req.memory_limit > req.memory_request else 0,
                    mem_types=types if types is not None else annotations.DEFAULT_MEMORY,
                    explicit_types=types is not None, hints=container.hints,
                    hide_ht=bool(annotations.hide_hyperthreads(container, pod)),
                    previous=CPUSet.parse_or_empty(container.previous))
        reserved_hint = annotations.bool_hint(container, pod, annotations.PREFER_RESERVED)
        if self.reserved_pool is not None and (
                reserved_hint or (reserved_hint is None and self._reserved_namespace(pod.namespace))):
            used = sum(self.grants[k].milli for k in self.grants if self.grants[k].reserved and k != container.key)
            if used + req.cpu_request <= 1000 * len(self.reserved):
                r.reserved, r.on_shared, r.shared = True, False, req.cpu_request
                return r
            # More than the reserved CPUs have left: the whole machine's shared CPUs, as nri-plugins
            # places it, rather than overcommitting the reserved ones.
            r.shared, r.lift = req.cpu_request, len(self.pools)
            return r
        r.affinity = self._affinity(container, pod, view)
        shared_hint, r.lift = annotations.prefer_shared(container, pod)
        all_shared = shared_hint if shared_hint is not None else self.prefer_shared
        whole, fraction = req.whole_cpus, req.fraction
        # Only Guaranteed containers get exclusive CPUs; 2 CPUs or more only for whole CPUs,
        # unless the pod explicitly says prefer-shared-cpus: false.
        if (req.qos != QOSClass.GUARANTEED or whole == 0 or all_shared
                or (whole >= 2 and fraction and shared_hint is not False)):
            r.shared = req.cpu_request
            if req.qos == QOSClass.BURSTABLE:
                if not req.cpu_limit:
                    r.burst_level = self._unlimited_level(container, pod)
                elif req.cpu_limit > req.cpu_request:
                    r.burst_limit = req.cpu_limit
            return r
        r.exclusive, r.shared, r.on_shared = whole, fraction, bool(fraction)
        r.prefer = preferences(container, pod, self.topology)
        iso_hint = annotations.prefer_isolated(container, pod)
        r.isolated = iso_hint if iso_hint is not None else (self.prefer_isolated and whole == 1)
        return r

    def _unlimited_level(self, container: Container, pod: Pod) -> int:
        """The widest pool level for a Burstable container without a CPU limit: its annotation, or
        UnlimitedBurstable."""
        found = annotations.hint(container, pod, UNLIMITED_BURSTABLE)
        if found is None:
            return self.unlimited_burstable
        key, value = found
        word = str(value).strip().lower()
        if word not in LEVELS:
            raise PolicyError(f"annotation {key} of container {container.name}: {value!r} is not one of "
                              f"{', '.join(LEVELS)}")
        return LEVELS.index(word)

    def _reserved_namespace(self, namespace: str) -> bool:
        return in_namespaces(namespace, self.reserved_namespaces)

    def _affinity(self, container: Container, pod: Pod, view: View) -> dict[str, float]:
        """Weight towards each placed container (ColocatePods/Namespaces add 1 each)."""
        rules = affinities(container, pod)
        if not rules and not self.colocate_pods and not self.colocate_namespaces:
            return {}
        out: dict[str, float] = {}
        for key in self.grants:
            other = view.containers.get(key)
            if other is None or key == container.key:
                continue
            other_pod = view.pods.get(other.pod_id)
            weight = 0.0
            for a in rules:
                if a.in_scope(container, other, other_pod) and a.match(other, other_pod):
                    weight += a.weight
            if self.colocate_pods and other.pod_id == container.pod_id:
                weight += 1
            if self.colocate_namespaces and other_pod is not None and other_pod.namespace == pod.namespace:
                weight += 1
            if weight:
                out[key] = weight
        return out

    def _fit(self, pool: Pool, r: Request) -> tuple[bool, int] | None:
        """(isolated?, capacity left) if the pool can take the request, else None."""
        if r.reserved:  # system containers always run, on the reserved CPUs, whatever the memory
            return (False, 0) if pool is self.reserved_pool else None
        if self.memory_types_present:  # without NUMA information memory is not placed at all
            if r.memory and self._memory_free(pool, r.mem_types) < r.memory:
                return None
            if r.memory_span and pool.memory_of(r.mem_types) < r.memory_span <= self.pools[0].memory_of(r.mem_types):
                return None
            if not pool.mems_of(r.mem_types):
                return None
        isolated = False
        if r.exclusive:
            free_iso = pool.isolated - self._taken
            if r.isolated and len(free_iso) >= r.exclusive:
                isolated = True
            elif any(self._spare_own(a, r.shared, r.on_shared) < r.exclusive for a in pool.ancestors[1:]) \
                    or self._spare(pool, r.shared, r.on_shared) < r.exclusive:
                return None
        if r.on_shared and not self._sharable[pool.id] and (r.shared or not self.shared_cpus(pool)):
            return None  # only a container asking for no CPU time may run on another pool's or reserved CPUs
        take = 0 if isolated else 1000 * r.exclusive
        left = self._shared_free(pool) - take - (r.shared if r.on_shared else 0)
        if left < 0:
            return None
        if isolated:
            return True, len(pool.isolated - self._taken) - r.exclusive
        return False, left

    def _place(self, r: Request) -> Grant:
        """The grant for a request. When exclusive CPUs fit no pool, or only one that would slice them
        over several children, because the free shared capacity is spread thin over many pools (each
        keeps what its own shared containers request), they are taken from the deepest pool the
        machine's capacity allows, as kubelet's single shared pool would: the scheduler admitted the
        pod, so the node has the CPUs. The pool that lost CPUs then holds shared containers
        requesting more than its shared CPUs (a notice says so)."""
        strict: Pool | None = None
        try:
            strict = self._choose(r)
        except PolicyError:
            if not r.exclusive or r.isolated and len(self.isolated - self._taken) >= r.exclusive:
                raise
        if strict is not None and (not r.exclusive or not strict.children or not self.one_leaf):
            return self._grant(strict, r)
        # Exclusive CPUs that would be sliced over several children: one child by the machine's
        # capacity keeps them in one node or L3 domain (the container asked for whole CPUs; the
        # shared containers there make do with less for a while, as they would in kubelet's pool).
        self._relaxed = True
        try:
            relaxed = self._choose(r)
            if strict is None or relaxed.depth > strict.depth:
                return self._grant(relaxed, r)
        finally:
            self._relaxed = False
        return self._grant(strict, r)

    def _choose(self, r: Request) -> Pool:
        ranked = []
        for pool in self.pools:
            fit = self._fit(pool, r)
            if fit is None:
                continue
            isolated, left = fit
            affinity = 0.0
            for key, weight in r.affinity.items():
                g = self.grants.get(key)
                if g is not None:
                    affinity += weight * pool.overlap(self.by_name[g.pool])
            all_types = not r.explicit_types or all(pool.mems.get(t) for t in r.mem_types)
            preferred_cpu = isolated == r.isolated
            mems = pool.all_mems
            hinted = sum(1 for nodes in r.hints.values() if any(n in mems for n in nodes))
            elsewhere = r.on_shared and not self._sharable[pool.id]  # would run on another pool's CPUs
            split = self._split(pool, r) if r.exclusive and not isolated else 0
            # The deepest pool holding where it ran before, as kubelet keeps a container's CPUs.
            sticky = -pool.depth if r.previous and r.previous <= pool.cpus else 1
            # A Burstable container goes no deeper than what it may burst to allows.
            narrow = not r.bursts_in(pool)
            # As nri-plugins ranks them: exclusive CPUs where most shared capacity is left; shared ones
            # where fewest containers are, then most capacity, so they spread over the pools.
            # A pool running containers that ask for no CPU time counts 1m less, as nri-plugins has it.
            if any(self._idle[q.id] for q in pool.subtree):
                left -= 1
            spread = (-left, 0) if r.exclusive else (self._colocated[pool.id], -left)
            ranked.append(((elsewhere, sticky, -affinity, narrow, not all_types, -hinted, not preferred_cpu, split,
                            -pool.depth, *spread, pool.id), pool))
        if not ranked:
            raise PolicyError(f"container {r.who}: no pool can take {r.describe() or 'it'}; free: {self._free()}")
        best = min(ranked, key=lambda x: x[0])[1]
        for _ in range(r.lift):  # prefer-shared-cpus: -N places it N pools further up
            if best.parent is None or self._fit(best.parent, r) is None:
                break
            best = best.parent
        return best

    def _split(self, pool: Pool, r: Request) -> int:
        """1 when the pool's shared CPUs lack the whole cores an exclusive slice needs (whole cores first)."""
        sharable = self._sharable[pool.id]
        whole = sum(len(core) for core in self.topology.cores.values() if core <= sharable)
        return 1 if whole < r.exclusive - r.exclusive % self._threads else 0

    def _free(self) -> str:
        parts = []
        for p in self.pools:
            mem = ", ".join(f"{self._memory_free(p, frozenset((t,))) >> 20} MiB {t}" for t in sorted(p.mems))
            parts.append(f"{p.name}: {len(self._sharable[p.id])} shared CPUs ({self._shared_free(p)}m unclaimed), "
                         f"{len(p.isolated - self._taken)} isolated" + (f", {mem}" if mem else ""))
        return "; ".join(parts)

    def _grant(self, pool: Pool, r: Request) -> Grant:
        exclusive = EMPTY
        if r.reserved:
            return Grant(pool.name, reserved=True, milli=r.shared, memory=r.memory, mem_types=r.mem_types,
                         hide_ht=r.hide_ht)
        if r.exclusive:
            free_iso = pool.isolated - self._taken
            if r.isolated and len(free_iso) >= r.exclusive:
                exclusive = take_cpus(self.topology, free_iso, r.exclusive, r.prefer)
            else:
                exclusive = self._slice(pool, r.exclusive, r.prefer)
        return Grant(pool.name, exclusive, shared=r.shared if r.on_shared else 0, on_shared=r.on_shared,
                     milli=1000 * r.exclusive + r.shared, memory=r.memory, mem_types=r.mem_types, hide_ht=r.hide_ht)

    def _slice(self, pool: Pool, count: int, prefer: Preferences) -> CPUSet:
        """count CPUs off the pool's shared set, spread over children as their spare allows."""
        if not pool.children:
            return take_cpus(self.topology, self._sharable[pool.id], count, prefer)
        spare = {c.id: max(self._spare(c), 0) for c in pool.children}
        holding = [c for c in pool.children if spare[c.id] >= count]
        if holding:  # the child that holds it with the least to spare
            return self._slice(min(holding, key=lambda c: (spare[c.id], c.id)), count, prefer)
        out = EMPTY
        threads = self._threads
        for whole in (True, False):  # whole cores from each child first, so no core is split between two
            for child in sorted(pool.children, key=lambda c: (-spare[c.id], c.id)):
                left = count - len(out)
                n = min(spare[child.id], left)
                if whole and n < left:
                    n -= n % threads
                if n > 0:
                    got = self._slice(child, n, prefer)
                    out |= got
                    spare[child.id] -= len(got)
                if len(out) == count:
                    return out
        return out

    # -- resources -------------------------------------------------------------------------
    def _keep(self, key: str, grant: Grant, keep: CPUSet) -> Grant:
        """grant with keep as its exclusive CPUs, if they are its pool's isolated or general CPUs, free,
        and leave every pool consistent; else grant as it is."""
        pool = self.by_name[grant.pool]
        if not (keep <= pool.isolated or keep <= pool.general) or not keep.isdisjoint(self._taken):
            return grant
        kept = replace(grant, exclusive=keep)
        self._add(key, kept)
        problem = self._overcommitted()
        self._remove(key)
        return grant if problem else kept

    def cpus_of_grant(self, g: Grant) -> CPUSet:
        """The CPUs the grant's container runs on."""
        pool = self.by_name[g.pool]
        if g.claim:
            held = self.grants.get(claims.key(g.claim))
            return held.exclusive if held is not None else EMPTY
        cpus = g.exclusive
        if g.reserved:
            cpus |= self.reserved
        if g.on_shared:
            cpus |= self.shared_cpus(pool)
        return one_thread_per_core(self.topology, cpus) if g.hide_ht else cpus

    def mems_of_grant(self, g: Grant, cpus: CPUSet | None = None) -> CPUSet:
        """Its memory nodes; cpus: the grant's CPUs when the caller has them already."""
        pool = self.by_name[g.memory_pool]
        mems = pool.mems_of(g.mem_types) or pool.all_mems
        if g.mem_pool:  # moved up for room: the wider pool's memory on purpose
            return mems
        # Memory follows the CPUs the container really has: a NUMA node with CPUs, none of them its
        # own (out of AvailableResources, or all taken), is left out, as nri-plugins does, unless
        # the container's memory needs it (a pool chosen for its memory keeps all of it).
        cpus = self.cpus_of_grant(g) if cpus is None else cpus
        foreign = CPUSet(n.id for n in self.topology.nodes.values() if n.cpus and not n.cpus & cpus)
        near = mems - foreign
        if not near or sum(self.topology.nodes[n].memory for n in near) < g.memory:
            return mems
        return near

    def _placed(self, g: Grant) -> tuple[CPUSet, CPUSet]:
        """The grant's CPUs and memory nodes (the CPUs read once: the memory follows them)."""
        cpus = self.cpus_of_grant(g)
        return cpus, self.mems_of_grant(g, cpus)

    def _resources(self, base: Resources, g: Grant) -> Resources:
        cpus, mems = self._placed(g)
        out = base.with_cpus(str(cpus)) if self.pin_cpu or g.claim else base.with_cpus(base.cpuset_cpus)
        if g.claim:
            out.cpu_shares = claims.shares(len(cpus), len(self._claim_users(g.claim)))
        if self.pin_memory:
            if mems:
                out.cpuset_mems = str(mems)
        return out

    def _snapshot(self) -> list[CPUSet]:
        return [self.shared_cpus(p) for p in self.pools]

    def _updates(self, before: list[CPUSet], view: View, skip: str) -> dict[str, Resources]:
        """Shared users of every pool whose shared CPUs moved."""
        updates: dict[str, Resources] = {}
        if not self.pin_cpu:
            return updates
        for pool in self.pools:
            if before[pool.id] == self.shared_cpus(pool):
                continue
            for key in sorted(self._users[pool.id]):
                c = view.containers.get(key)
                if key != skip and c is not None:
                    updates[key] = self._resources(c.resources, self.grants[key])
        return updates

    # -- the policy interface -------------------------------------------------------------
    def allocate(self, container: Container, pod: Pod, view: View) -> Decision:
        return self._allocate(container, pod, view, keep=CPUSet.parse_or_empty(container.previous))

    def adopt(self, container: Container, pod: Pod, view: View) -> Decision:
        return self._allocate(container, pod, view, keep=CPUSet.parse_or_empty(container.resources.cpuset_cpus))

    def _allocate(self, container: Container, pod: Pod, view: View, keep: CPUSet) -> Decision:
        """Place the container; an exclusive grant takes the CPUs in keep instead when they would do."""
        req = container_requirements(container, pod)
        claim = claims.claim_of(container, pod, {u: c for u, c in self.claims.items() if u not in self.unprepared})
        if claim is not None:
            return self._on_claim(container, pod, req, claim, view)
        before = self._snapshot()
        with self.grants.transaction():  # a failed re-allocation keeps what it had
            self._remove(container.key)
            r = self._request(container, pod, req, view)
            grant = self._place(r)
            if grant.exclusive and keep != grant.exclusive and len(keep) == len(grant.exclusive):
                grant = self._keep(container.key, grant, keep)
            self._add(container.key, grant)
        classes = class_names(container, pod)
        resources = self._resources(container.requested, grant)
        resources.cpu_shares = milli_to_shares(req.cpu_request)
        return Decision(resources=resources, classes=classes,
                        updates=self._updates(before, view, container.key))

    def update(self, container: Container, requested: Resources, view: View) -> Decision:
        g = self.grants.get(container.key)
        if g is None:
            return Decision()
        if g.claim:  # its CPUs are the claim's, whatever the request says
            return Decision(resources=self._resources(requested, g))
        memory = requested.memory_limit_in_bytes
        if memory > 0 and memory != g.memory:
            self._remove(container.key)
            self._add(container.key, replace(g, memory=memory))
            self._guard_memory([container.key])
            g = self.grants[container.key]
        return Decision(resources=self._resources(requested, g))

    def resize(self, container: Container, pod: Pod, requested: Resources, view: View) -> Decision:
        held = self.grants.get(container.key)
        if held is not None and held.claim:
            return self.update(container, requested, view)
        if held is not None and not held.exclusive and requested.cpu() == container.requested.cpu():
            return self.update(container, requested, view)  # memory alone: re-accounted where it is
        keep = held.exclusive if held is not None else EMPTY
        return self._allocate(replace(container, requested=requested), pod, view, keep)

    def _guard_memory(self, keys: list[str]) -> None:
        """Widen the memory of grants that no longer fit to the nearest pool up that fits."""
        for key in keys:
            g = self.grants[key]
            if not g.memory:
                continue
            pool = self.by_name[g.memory_pool]
            self._remove(key)
            target = pool
            while self._memory_free(target, g.mem_types) < g.memory and target.parent is not None:
                target = target.parent
            self._add(key, replace(g, mem_pool="" if target.name == g.pool else target.name))

    def rename(self, old_key: str, new_key: str) -> None:
        g = self._remove(old_key)
        if g is not None:
            self._add(new_key, g)

    def rebalance(self, view: View) -> Decision:
        """Place every shared-only container anew, biggest first; exclusive grants stay."""
        movable = [k for k, g in self.grants.items() if g.kind == "shared" and k in view.containers
                   and view.containers[k].pod_id in view.pods]
        before = {k: self._placed(g) for k, g in self.grants.items()}
        try:
            with self.grants.transaction():
                old = {k: self._remove(k) for k in movable}
                movable.sort(key=lambda k: (-old[k].shared, -old[k].memory, k))
                for key in movable:
                    c = view.containers[key]
                    pod = view.pods[c.pod_id]
                    r = self._request(c, pod, container_requirements(c, pod), view)
                    self._add(key, self._grant(self._choose(r), r))  # shared only: never relaxed
        except PolicyError:
            # The new arrangement has no room for everyone, and the old room may be taken already:
            # the old arrangement, which fitted, is back.
            return Decision()
        updates = {}
        for key, g in self.grants.items():
            c = view.containers.get(key)
            if c is not None and before.get(key) != self._placed(g):
                updates[key] = self._resources(c.resources, g)
        return Decision(updates=updates)

    def reconfigure(self, config: Mapping[str, Any], view: View) -> Decision:
        """Take a new configuration keeping every grant where it is, or raise and change nothing."""
        fresh = type(self)(config, self.topology)
        fresh.restore_state(self.export_state())
        updates = {}
        for key, g in fresh.grants.items():
            c = view.containers.get(key)
            if c is None:
                continue
            now = fresh._resources(c.resources, g)
            if (now.cpuset_cpus, now.cpuset_mems) != (c.resources.cpuset_cpus, c.resources.cpuset_mems):
                updates[key] = now
        self.__dict__.update(fresh.__dict__)
        self.grants.on_change = self._account  # it was fresh's
        return Decision(updates=updates)

    def export_state(self) -> dict[str, Any]:
        return {"grants": {k: g.to_dict() for k, g in sorted(self.grants.items())},
                **claims.export(self.claims, self.unprepared)}

    def restore_state(self, data: Mapping[str, Any]) -> None:
        """Reinstate persisted grants exactly; PolicyError (nothing kept) if any cannot be."""
        grants = {k: Grant.from_dict(v) for k, v in (data.get("grants") or {}).items()
                  if not k.startswith("pending:")}
        self.grants.clear()
        self.claims, self.unprepared = claims.restore(data)
        try:
            for key, g in sorted(grants.items()):
                if g.claim and g.claim not in self.claims:
                    raise PolicyError(f"grant of {key} uses claim {g.claim}, which is not prepared")
                self._restore_one(key, g)
            problem = self._overcommitted()
            if problem:
                raise PolicyError(problem)
        except PolicyError:
            self.grants.clear()
            self.claims, self.unprepared = {}, set()
            raise
        self._guard_memory(sorted(self.grants))

    def _overcommitted(self) -> str:
        """What is wrong with the grants as they stand ("" when nothing is): shared users without CPUs,
        or more shared CPU time granted than the machine's shared CPUs have (a pool may hold more
        than its own after a relaxed placement, see _place)."""
        for pool in self.pools:
            if self._users[pool.id] and not self.shared_cpus(pool):
                return f"pool {pool.name} has shared users and no shared CPU left"
        root = self.pools[0]
        if 1000 * len(self._sharable[root.id]) < self._subtree_milli(root):
            return (f"{self._subtree_milli(root)}m shared CPU granted, only {len(self._sharable[root.id])} "
                    "shared CPUs")
        return ""

    def _restore_one(self, key: str, g: Grant) -> None:
        if g.reserved:
            if self.reserved_pool is None:
                raise PolicyError(f"grant of {key} is on reserved CPUs; none are reserved now")
            g = replace(g, pool=self.reserved_pool.name, mem_pool="")
        pool = self.by_name.get(g.pool)
        if pool is None:
            raise PolicyError(f"grant of {key} is in pool {g.pool!r}, which does not exist now")
        if g.mem_pool and g.mem_pool not in self.by_name:
            g = replace(g, mem_pool="")
        if not g.exclusive <= pool.cpus - pool.reserved:
            raise PolicyError(f"grant of {key} holds CPUs {g.exclusive - (pool.cpus - pool.reserved)} outside "
                              f"pool {pool.name}'s unreserved CPUs")
        if not g.exclusive.isdisjoint(self._taken):
            raise PolicyError(f"grant of {key} holds CPUs {g.exclusive & self._taken} another grant holds")
        self._add(key, g)

    def describe_pools(self) -> list[dict[str, Any]]:
        exclusive = [0] * len(self.pools)
        for g in self.grants.values():
            if g.exclusive:
                exclusive[self.by_name[g.pool].id] += 1
        return [pool_entry(self.topology, p.name, p.cpus, self._sharable[p.id],
                           parent=p.parent.name if p.parent else "", reserved=p.reserved,
                           isolated=p.isolated - self._taken, exclusive_grants=exclusive[p.id],
                           containers=self._count[p.id], requested=self._milli[p.id],
                           # what the pool's own shared CPUs can still give, its children's requests counted
                           free=1000 * len(self._sharable[p.id]) - self._subtree_milli(p),
                           # shared users running on an ancestor's or the reserved CPUs, none of the pool's own left
                           elsewhere=len(self._users[p.id]) if not self._sharable[p.id] else 0,
                           mems=p.all_mems, memory={t.value: p.memory[t] for t in sorted(p.memory)})
                for p in self.pools]

    def describe_grant(self, key: str) -> dict[str, Any] | None:
        g = self.grants.get(key)
        if g is None:
            return None
        doc = {"pool": g.pool, "exclusive": str(g.exclusive), "shared_milli": g.shared, "kind": g.kind}
        if g.claim:
            doc.update(claim=g.claim, exclusive=str(self.cpus_of_grant(g)))
        pool = self.by_name[g.pool]
        if g.on_shared and not self._sharable[pool.id]:
            doc["fallback"] = "reserved" if self._lender(pool) is None else "parent"
        return doc


    # -- DRA claims (docs/dra.md) ------------------------------------------------------------
    def _claim_users(self, uid: str) -> list[str]:
        return sorted(k for k, g in self.grants.items() if g.claim == uid)

    def _claim_room(self, pool: Pool) -> int:
        """CPUs a new claim may still take from the pool (each ancestor keeping what its users need)."""
        return max(min([self._spare(pool)] + [self._spare_own(a) for a in pool.ancestors[1:]]), 0)

    def devices(self) -> list[dict[str, Any]]:
        out = []
        for name, (pool, attrs) in self.dra.items():
            held = sum(len(self.grants[claims.key(u)].exclusive) for u, c in self.claims.items()
                       if c.device == name and claims.key(u) in self.grants)
            out.append({"name": name, "attributes": attrs, "cpus": held + self._claim_room(pool),
                        "cpuset": str(pool.cpus)})
        return out

    def _hold(self, claim: Claim) -> int:
        if claim.device not in self.dra:
            raise PolicyError(f"{claim.who}: this node has no device {claim.device} (it offers "
                              f"{', '.join(self.dra) or 'none'})")
        pool = self.dra[claim.device][0]
        room = self._claim_room(pool)
        count = claim.cpus or room
        if count <= 0 or count > room:
            raise PolicyError(f"{claim.who}: device {claim.device} can give {room} CPU(s), the claim asks "
                              f"for {count}")
        with self.grants.transaction():
            self._add(claims.key(claim.uid), Grant(pool.name, self._slice(pool, count, ANY), milli=1000 * count))
            problem = self._overcommitted()
            if problem:
                raise PolicyError(f"{claim.who}: {problem}")
        return count

    def _user_claim(self, key: str) -> str:
        g = self.grants.get(key)
        return g.claim if g is not None else ""

    def _user_resources(self, key: str, c: Container) -> Resources:
        return self._resources(c.resources, self.grants[key])

    def _on_claim(self, container: Container, pod: Pod, req: Requirements, claim: Claim, view: View) -> Decision:
        """A container on a claim's CPUs, with the memory of the claim's pool; the other users of the
        claim get their new share of its CPU time."""
        pool = self.by_name[self.grants[claims.key(claim.uid)].pool]
        with self.grants.transaction():
            self._remove(container.key)
            self._add(container.key, Grant(pool.name, memory=req.memory_limit or req.memory_request,
                                           claim=claim.uid))
        return Decision(resources=self._resources(container.requested, self.grants[container.key]),
                        classes=class_names(container, pod), updates=self._sharers(claim.uid, view, container.key))

    def describe_claim(self, uid: str) -> dict[str, Any] | None:
        claim, held = self.claims.get(uid), self.grants.get(claims.key(uid))
        if claim is None or held is None:
            return None
        pool = self.by_name[held.pool]
        return {"device": claim.device, "cpus": str(held.exclusive), "mems": str(pool.all_mems),
                "users": self._claim_users(uid), "unprepared": uid in self.unprepared}
