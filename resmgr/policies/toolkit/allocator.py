"""Choosing CPUs: which `count` of the available ones a grant gets.

The machine is a tree of the levels that nest (Topology.hierarchy: package, die, NUMA
node, L3 domain, L2 cluster, core). A choice is judged, in this order, by:

1. partial cores: cores it takes some but not all threads of (whole cores first, as
   kubelet's full-pcpus-only; a lone thread of an odd count is unavoidable);
2. spread: how many packages, dies, nodes, L3 domains, L2 clusters and cores it touches,
   coarse first (within one L2 cluster beats within one L3 domain beats within one NUMA
   node, as prefer-align-cpus-by-uncorecache and better);
3. idle cores it breaks (a lone thread comes from a core already in use);
4. packing: the tightest domain that holds it (big free blocks stay whole), or with
   `balance` the one with the most free CPUs (balloons' allocatorTopologyBalancing), which
   then comes before 3: balancing spreads first, and a balloon sharing its idle siblings
   (shareIdleCPUsInSame) gets a core of its own rather than the last thread of a used one;
5. lowest CPU IDs. Deterministic for the same inputs.

The search descends the tree: at each domain it weighs every child that can hold the
whole request against spilling over several children (whole children first, the rest
from the best child that holds it), remembering what it has weighed.

Preferences on top: a core kind (hybrid parts), taken alone when it holds the request in
whole cores, else the other kind alone if that does, else the preferred kind alone, else
the best of both; and one thread per core first (spread on cores).
"""

from __future__ import annotations

from dataclasses import dataclass

from resmgr.model import Container, Pod, QOSClass
from resmgr.policies.toolkit.annotations import core_kind
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import CoreKind, Topology


class AllocationError(Exception):
    pass


@dataclass(frozen=True)
class Preferences:
    kind: CoreKind = CoreKind.UNKNOWN  # a core kind to take first (UNKNOWN: any)
    spread_cores: bool = False  # one thread per physical core first
    balance: bool = False  # the domains with the most free CPUs first, instead of packing
    avoid: CPUSet = EMPTY  # CPUs taken only where the others do not do (kept for containers to come)


ANY = Preferences()


def preferences(container: Container, pod: Pod, topology: Topology, balance: bool = False,
                avoid: CPUSet = EMPTY) -> Preferences:
    """What a container's exclusive CPUs should be: the prefer-core-type annotation, else
    performance cores for Guaranteed containers on a hybrid part; none of avoid (View.held) where
    enough others are free."""
    kind = core_kind(container, pod)
    if kind is None:
        kind = CoreKind.PERFORMANCE if topology.hybrid and pod.qos_class == QOSClass.GUARANTEED else CoreKind.UNKNOWN
    return Preferences(kind=kind, balance=balance, avoid=avoid)


def one_thread_per_core(topology: Topology, cpus: CPUSet) -> CPUSet:
    """The lowest CPU of each core cpus touch (what a container hiding hyperthreads runs on)."""
    core_of = topology.core_of
    seen: set[tuple[int, int, int]] = set()
    out = []
    for cpu in cpus:
        core = core_of.get(cpu)
        if core is None or core not in seen:
            out.append(cpu)
            if core is not None:
                seen.add(core)
    return CPUSet(out)


def take_cpus(topology: Topology, available: CPUSet, count: int, prefer: Preferences = ANY) -> CPUSet:
    """count CPUs out of available, chosen as the module says; AllocationError when too few."""
    if count < 0:
        raise AllocationError(f"cannot take {count} CPUs")
    if count > len(available):
        raise AllocationError(f"need {count} CPUs, only {len(available)} available ({available or 'none'})")
    if count == 0:
        return EMPTY
    if prefer.avoid and len(available - prefer.avoid) >= count:
        available = available - prefer.avoid
    if prefer.kind and topology.hybrid:
        own = available & topology.kinds.get(prefer.kind, EMPTY)
        other = available - own
        # One kind alone, the preferred one unless only the other gives whole cores; else both.
        options = [(split_cores(topology, chosen), rank, chosen) for rank, alone in enumerate((own, other))
                   if len(alone) >= count for chosen in [_spread_or_pick(topology, alone, count, prefer)]]
        if options:
            return min(options, key=lambda o: o[:2])[2]
    return _spread_or_pick(topology, available, count, prefer)


def split_cores(topology: Topology, cpus: CPUSet) -> int:
    """Cores cpus take part of, beyond the one an odd count must split."""
    cores = {topology.core_of[c] for c in cpus}
    partial = sum(1 for k in cores if not topology.cores[k] <= cpus)
    smt = any(len(topology.cores[k]) > 1 for k in cores)
    return partial - (len(cpus) % 2 if smt else 0)


def _spread_or_pick(topology: Topology, available: CPUSet, count: int, prefer: Preferences) -> CPUSet:
    if not prefer.spread_cores:
        return _Search(topology, available, prefer.balance).best(count)
    one_each = CPUSet(min(cpus & available) for cpus in topology.cores.values() if cpus & available)
    if len(one_each) >= count:
        return _Search(topology, one_each, prefer.balance).best(count)
    return one_each | _Search(topology, available - one_each, prefer.balance).best(count - len(one_each))


class _Domain:
    __slots__ = ("level", "cpus", "children")

    def __init__(self, level: int, cpus: CPUSet) -> None:
        self.level, self.cpus = level, cpus
        self.children: list[_Domain] = []


@dataclass(frozen=True)
class _Machine:
    """What the search needs of a topology, computed once."""
    root: _Domain
    core_of: dict[int, CPUSet]  # CPU -> its core's CPUs
    group_of: list[dict[int, int]]  # per level: CPU -> its group's index


_TREES: dict[int, tuple[Topology, _Machine]] = {}


def _tree(topology: Topology) -> _Machine:
    """The domain tree of a topology (kept for the few topologies a process sees)."""
    held = _TREES.get(id(topology))
    if held is not None and held[0] is topology:
        return held[1]
    root = _Domain(-1, topology.online)
    parents = [root]
    for depth, level in enumerate(topology.hierarchy):
        made = []
        for group in level.groups:
            d = _Domain(depth, group)
            next(p for p in parents if group <= p.cpus).children.append(d)
            made.append(d)
        parents = made
    if len(_TREES) > 16:
        _TREES.clear()
    machine = _Machine(root, {cpu: cpus for cpus in topology.cores.values() for cpu in cpus},
                       [{cpu: i for i, g in enumerate(level.groups) for cpu in g} for level in topology.hierarchy])
    _TREES[id(topology)] = (topology, machine)
    return machine


class _Search:
    def __init__(self, topology: Topology, free: CPUSet, balance: bool) -> None:
        self.topology, self.free, self.balance = topology, free, balance
        machine = _tree(topology)
        self.root, self.core_of, self.group_of = machine.root, machine.core_of, machine.group_of
        self.memo: dict[tuple[int, int], CPUSet] = {}

    def best(self, count: int) -> CPUSet:
        """The best choice; idle cores alone first (whole cores may lie in different children)."""
        options = [(self.pick(self.root, count), len(self.free), 0)]
        idle = CPUSet()
        for core in self.topology.cores.values():
            if core <= self.free:
                idle |= core
        if idle and idle != self.free:
            if len(idle) >= count:
                whole = _Search(self.topology, idle, self.balance).pick(self.root, count)
            else:
                whole = idle | _Search(self.topology, self.free - idle, self.balance).pick(self.root, count - len(idle))
            options.append((whole, len(self.free), 1))
        return min(options, key=self._rank)[0]

    def score(self, chosen: CPUSet) -> tuple[int, tuple[int, ...], int]:
        partial = broken = 0
        for core in {self.core_of[c] for c in chosen}:
            if not core <= chosen:
                partial += 1
                if (core - chosen) & self.free:
                    broken += 1
        spans = tuple(len({index[c] for c in chosen}) for index in self.group_of)
        return partial, spans, broken

    def pick(self, domain: _Domain, count: int) -> CPUSet:
        key = (id(domain), count)
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = self._pick(domain, count)
        return found

    def _pick(self, domain: _Domain, count: int) -> CPUSet:
        free = self.free & domain.cpus
        if len(free) == count:
            return free
        if not domain.children:  # a core: its lowest free threads
            return free.first(count)
        kids = [k for k in domain.children if self.free & k.cpus]
        holding = [k for k in kids if len(self.free & k.cpus) >= count]
        if holding and not holding[0].children:
            # Cores alike in size and free threads are alike as choices: weigh the first of each.
            alike: dict[tuple[int, int], _Domain] = {}
            for k in holding:
                alike.setdefault((len(k.cpus), len(self.free & k.cpus)), k)
            holding = list(alike.values())
        options = [(self.pick(k, count), len(self.free & k.cpus), 0) for k in holding]
        if not options:
            return self._spill(kids, count)
        return min(options, key=self._rank)[0]

    def _rank(self, option: tuple[CPUSet, int, int]) -> tuple[object, ...]:
        chosen, room, spilled = option
        partial, spans, broken = self.score(chosen)
        if self.balance:  # the emptiest domain first, even if that breaks an idle core there
            return partial, spans, spilled, -room, broken, chosen.bits & -chosen.bits
        return partial, spans, broken, spilled, room, chosen.bits & -chosen.bits

    def _spill(self, kids: list[_Domain], count: int) -> CPUSet:
        """Whole children, most free first, then the rest from the best child that holds it."""
        chosen, left = EMPTY, count
        rest = sorted(kids, key=lambda k: (-len(self.free & k.cpus), k.cpus.bits & -k.cpus.bits))
        while left:
            holding = [k for k in rest if len(self.free & k.cpus) >= left]
            if holding:
                options = [(self.pick(k, left), len(self.free & k.cpus), 0) for k in holding]
                return chosen | min(options, key=lambda o: self._rank((chosen | o[0], o[1], o[2])))[0]
            whole = rest.pop(0)
            chosen |= self.free & whole.cpus
            left -= len(self.free & whole.cpus)
        return chosen
