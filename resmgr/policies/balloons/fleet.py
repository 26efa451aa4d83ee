"""The balloons and their CPUs: which free CPUs a balloon takes as it grows, what it keeps as it
shrinks, composite balloons' parts, and where a member runs (its balloon's CPUs, the idle ones it
may share, the memory nodes near them)."""

from __future__ import annotations

from dataclasses import replace

from resmgr.policies.balloons.model import Balloon, Member, shares
from resmgr.policies.balloons.types import RESERVED, BalloonType, Settings
from resmgr.policies.base import PolicyError
from resmgr.policies.toolkit import annotations
from resmgr.policies.toolkit.allocator import Preferences, one_thread_per_core, take_cpus
from resmgr.topology.cpuset import EMPTY, CPUSet, union
from resmgr.topology.model import CoreKind, MemoryType, Topology


class Fleet:
    def __init__(self, settings: Settings, topology: Topology, isolated: CPUSet, reserved: CPUSet,
                 allocatable: CPUSet) -> None:
        self.settings, self.topo = settings, topology
        self.isolated, self.reserved, self.allocatable = isolated, reserved, allocatable
        self.types = {t.name: t for t in settings.types}
        self.balloons: list[Balloon] = [Balloon(t, 0) for t in settings.types if t.on_reserved]

    def owned(self) -> CPUSet:
        out = EMPTY
        for b in self.balloons:
            for leaf in b.leaves:
                out |= leaf.cpus
        return out

    def free(self, t: BalloonType | None = None) -> CPUSet:
        """CPUs in no balloon that a balloon of type t may take (isolated ones only if it prefers them)."""
        free = self.allocatable - self.owned()
        return free if t is not None and t.isolated else free - self.isolated

    def prefer(self, t: BalloonType, guaranteed: bool = False) -> Preferences:
        """How a balloon of type t chooses CPUs: PreferCoreType, else AllocatorPriority where set (high:
        performance cores, low: efficient ones), else performance cores for a Guaranteed container."""
        kind = t.core_kind
        if not kind and self.topo.hybrid:
            if t.priority is not None:
                kind = {0: CoreKind.PERFORMANCE, 2: CoreKind.EFFICIENT}.get(t.priority, CoreKind.UNKNOWN)
            elif guaranteed:
                kind = CoreKind.PERFORMANCE
        return Preferences(kind=kind, spread_cores=t.spread_cores, balance=t.balance)

    def take(self, t: BalloonType, count: int, near: CPUSet = EMPTY, guaranteed: bool = False,
              owner: Balloon | None = None) -> CPUSet:
        """count free CPUs for a balloon of type t: off the cores / L2 caches other balloons load
        when it has loads (while enough are free), then as _take_from says."""
        free = self.free(t)
        unloaded = free - self._loaded(t, owner)
        if t.loads and unloaded != free and len(unloaded) >= count:
            return self._take_from(t, unloaded, count, near, guaranteed)
        return self._take_from(t, free, count, near, guaranteed)

    def take_again(self, t: BalloonType, count: int, previous: CPUSet, near: CPUSet = EMPTY,
                   guaranteed: bool = False, owner: Balloon | None = None) -> CPUSet:
        """As take, but the CPUs a member ran on before (a restart, a node reboot) when enough of them
        are free: a balloon its members join again one by one, in any order, ends where it was."""
        again = previous & self.free(t)
        if previous and len(again) >= count:
            return take_cpus(self.topo, again, count, self.prefer(t, guaranteed))
        return self.take(t, count, near, guaranteed, owner)

    def _groups(self, level: str) -> list[CPUSet]:
        return list(self.topo.cores.values()) if level == "core" else list(set(self.topo.l2_of.values()))

    def _loaded(self, t: BalloonType, owner: Balloon | None) -> CPUSet:
        """CPUs on the cores / L2 caches that other balloons loading the same level hold (and, with
        OverloadsLevelInBalloon, that its own balloon holds)."""
        out = EMPTY
        for load in t.loads:
            holders = EMPTY
            for b in self.balloons:
                if (b is not owner or load.in_balloon) and any(x.level == load.level for x in b.type.loads):
                    holders |= b.cpus
            for g in self._groups(load.level):
                if g & holders:
                    out |= g
        return out

    def _take_from(self, t: BalloonType, free: CPUSet, count: int, near: CPUSet, guaranteed: bool) -> CPUSet:
        """count of free for a balloon of type t: isolated ones first if it prefers them, else the
        nearest to near (its own CPUs) that hold them, else the best anywhere."""
        prefer = self.prefer(t, guaranteed)
        # Another type's PreferCloseToDevices keeps this one away from those devices' nodes while
        # there is room elsewhere (nri-plugins' implied anti-affinity).
        away = union(self.topo.node_cpus(n) for o in self.settings.types if o is not t
                      for n in o.near_nodes if n not in t.near_nodes)
        if away and len(free - away) >= count:
            free = free - away
        near_nodes = CPUSet()
        for n in t.near_nodes:  # PreferCloseToDevices: the first device's node that holds it
            if len(free & self.topo.node_cpus(n)) >= count:
                near_nodes = free & self.topo.node_cpus(n)
                break
        if near_nodes:
            free = near_nodes
        if any(load.in_balloon and load.level == "core" for load in t.loads):
            prefer = replace(prefer, spread_cores=True)
        if any(load.in_balloon and load.level == "l2cache" for load in t.loads):
            one_each = CPUSet(min(g & free) for g in self._groups("l2cache") if g & free and not g & near)
            if len(one_each) >= count:
                free = one_each
        if t.isolated:
            iso = free & self.isolated
            if len(iso) >= count:
                return take_cpus(self.topo, iso, count, prefer)
            return iso | take_cpus(self.topo, free - iso, count - len(iso), prefer)
        if near:
            for level in reversed(self.topo.hierarchy):
                if level.name == "core" and prefer.spread_cores:
                    continue
                region = EMPTY
                for g in level.groups:
                    if g & near:
                        region |= g
                if len(free & region) >= count:
                    return take_cpus(self.topo, free & region, count, prefer)
        return take_cpus(self.topo, free, count, prefer)

    def size(self, t: BalloonType, milli: int, members: bool) -> int | None:
        """The CPUs a balloon of type t holds for milli requested (None: more than MaxCPUs)."""
        need = -(-milli // 1000)
        if t.max_cpus and need > t.max_cpus:
            return None
        return max(need, t.min_cpus, 1 if members else 0)

    def resize(self, b: Balloon, size: int, guaranteed: bool = False, previous: CPUSet = EMPTY) -> None:
        """Grow (for a Guaranteed container: performance cores on a hybrid part; onto the CPUs the
        joining member ran on before where they are free) or shrink b; a composite's parts share the
        size evenly."""
        if b.type.on_reserved:
            if b.type.name == RESERVED:
                self.fit_reserved(b)
            return
        if size == len(b.cpus):
            return
        if b.parts:
            for part, share in zip(b.parts, shares(size, len(b.parts)), strict=True):
                self.resize(part, max(share, part.type.min_cpus), guaranteed)
                b.cpus = union(p.cpus for p in b.parts)
            return
        if size > len(b.cpus):
            b.cpus |= self.take_again(b.type, size - len(b.cpus), previous, b.cpus, guaranteed, owner=b)
        else:  # keep its most compact part
            b.cpus = take_cpus(self.topo, b.cpus, size, self.prefer(b.type))

    def fit_reserved(self, b: Balloon) -> None:
        """The reserved balloon is the reserved CPUs. As nri-plugins has it, when a `reserved` type
        sets MinCPUs or MaxCPUs it grows past them with free CPUs near them while its containers
        request more (up to MaxCPUs), and gives them back as they go. What it cannot get is
        overcommitted, with a notice (fallback)."""
        if not b.type.grows:
            return
        want = -(-b.milli // 1000) - len(self.reserved)
        if b.type.max_cpus:
            want = min(want, b.type.max_cpus - len(self.reserved))
        want = max(want, 0)
        if want > len(b.cpus):
            more = min(want - len(b.cpus), len(self.free(b.type)))
            if more:
                b.cpus |= self.take(b.type, more, self.reserved | b.cpus)
        elif want < len(b.cpus):
            b.cpus = take_cpus(self.topo, b.cpus, want, self.prefer(b.type)) if want else EMPTY

    def new_balloon(self, t: BalloonType, size: int, group: str = "", guaranteed: bool = False,
                    previous: CPUSet = EMPTY, index: int | None = None) -> Balloon:
        """A balloon of type t with size CPUs, numbered index (default: the lowest its type has free)."""
        if index is None:
            index = self.free_indexes(t, 1)[0]
        b = Balloon(t, index, group=group)
        self.balloons.append(b)
        self._fill(b, size, guaranteed, previous)
        return b

    def _fill(self, b: Balloon, size: int, guaranteed: bool, previous: CPUSet = EMPTY) -> None:
        """Give a new balloon its CPUs: those its first member ran on before when they are free, else
        a composite's parts (hidden balloons of the component types) one after the other, each its
        even share by its own type's preferences."""
        if not b.type.components:
            b.cpus = self.take_again(b.type, size, previous, guaranteed=guaranteed)
            return
        names = b.type.components
        if b.type.balance_components:  # one part, of the first component type in fewest balloons
            names = (min(names, key=lambda n: (self.in_use(self.types[n]), names.index(n))),)
        for name, share in zip(names, shares(size, len(names)), strict=True):
            t = self.types[name]
            part = Balloon(t, len(b.parts))
            b.parts.append(part)
            self._fill(part, max(share, t.min_cpus), guaranteed)
            b.cpus = union(p.cpus for p in b.parts)

    def free_indexes(self, t: BalloonType, count: int) -> list[int]:
        """The lowest count instance numbers no balloon of type t has."""
        used = {b.index for b in self.balloons if b.type is t}
        return [i for i in range(len(used) + count) if i not in used][:count]

    def in_use(self, t: BalloonType) -> int:
        """Balloons of type t, composites' parts at any depth included; for a composite type, those of
        its component types (nri-plugins' measure for balance-balloons)."""
        if t.components:
            return sum(self.in_use(self.types[c]) for c in t.components)

        def count(b: Balloon) -> int:
            return (b.type is t) + sum(count(p) for p in b.parts)

        return sum(count(b) for b in self.balloons)

    def make_min_balloons(self) -> None:
        for t in sorted(self.settings.types, key=lambda t: (t.priority or 0, t.order)):
            if t.on_reserved:
                continue
            while sum(1 for b in self.balloons if b.type is t) < t.min_balloons:
                if len(self.free(t)) < t.min_cpus:
                    raise PolicyError(f"balloon type {t.name}: no room for {t.min_balloons} balloons of "
                                      f"{t.min_cpus} CPUs ({len(self.free(t))} CPUs free: {self.free(t) or 'none'})")
                self.new_balloon(t, t.min_cpus)

    def runs_on(self, b: Balloon, m: Member) -> CPUSet:
        base = self.reserved | b.cpus if b.type.on_reserved or not b.cpus else b.cpus
        scope = b.type.share_idle
        if scope and b.cpus:
            idle = self.free()
            if scope == "system":
                base |= idle
            else:
                groups = {"package": self.topo.packages.values(), "die": self.topo.dies.values(),
                          "numa": [self.topo.node_cpus(n) for n in self.topo.nodes],
                          "l2cache": set(self.topo.l2_of.values()), "core": self.topo.cores.values()}[scope]
                for g in groups:
                    if g & b.cpus:
                        base |= g & idle
        return one_thread_per_core(self.topo, base) if m.hide_ht or b.type.hide_ht else base

    @staticmethod
    def mem_types(b: Balloon, m: Member) -> frozenset[MemoryType]:
        """The container's memory-type annotation, else its type's MemoryTypes, else DRAM and PMEM."""
        return m.mem_types or b.type.memory_types or annotations.DEFAULT_MEMORY

    def mems(self, cpus: CPUSet, types: frozenset[MemoryType]) -> CPUSet:
        """The memory nodes of the CPUs' NUMA nodes, of the given types (memory-only nodes by distance)."""
        nodes = {self.topo.cpus[c].node for c in cpus if c in self.topo.cpus and self.topo.cpus[c].node >= 0}
        out = set()
        cpu_nodes = [n for n in self.topo.nodes.values() if n.cpus]
        for n in self.topo.nodes.values():
            if not n.memory or n.kind not in types:
                continue
            if n.id in nodes:
                out.add(n.id)
            elif not n.cpus and cpu_nodes:
                nearest = min(cpu_nodes, key=lambda c: (n.distances.get(c.id, 1 << 16), c.id))
                if nearest.id in nodes:
                    out.add(n.id)
        return CPUSet(out) if out else CPUSet(nodes)
