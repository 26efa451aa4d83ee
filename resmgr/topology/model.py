"""An immutable snapshot of the machine: CPUs, packages, dies, cores, NUMA nodes, caches."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import TypeVar

from resmgr.topology.cpuset import EMPTY, CPUSet

K = TypeVar("K")


class MemoryType(StrEnum):
    DRAM = "dram"
    PMEM = "pmem"
    HBM = "hbm"


class CoreKind(StrEnum):
    """What kind of core a CPU is on a hybrid part; UNKNOWN on a machine with one kind."""
    PERFORMANCE = "performance"
    EFFICIENT = "efficient"
    UNKNOWN = ""


@dataclass(frozen=True)
class CPU:
    id: int
    package: int
    die: int
    core: int  # core_id as the kernel reports it (unique within a package and die)
    node: int  # NUMA node, -1 when the kernel reports none
    threads: CPUSet  # hyperthread siblings, including this CPU
    isolated: bool = False
    base_frequency: int = 0  # kHz; 0 when unknown
    max_frequency: int = 0
    kind: CoreKind = CoreKind.UNKNOWN


@dataclass(frozen=True)
class Node:
    id: int
    cpus: CPUSet
    memory: int  # bytes
    kind: MemoryType
    distances: Mapping[int, int] = field(default_factory=dict)  # node id -> distance

    @property
    def has_cpus(self) -> bool:
        return bool(self.cpus)


@dataclass(frozen=True)
class Cache:
    level: int
    kind: str  # Data, Instruction, Unified
    id: int
    cpus: CPUSet
    size: int = 0  # bytes


@dataclass(frozen=True)
class Level:
    """One level of the machine's hierarchy: its name and its groups of online CPUs."""
    name: str  # package, die, node, l3, l2, core
    groups: tuple[CPUSet, ...]


@dataclass(frozen=True)
class Topology:
    cpus: Mapping[int, CPU]  # online CPUs only
    offline: CPUSet
    isolated: CPUSet
    nodes: Mapping[int, Node]
    caches: tuple[Cache, ...] = ()
    # The interrupts /proc/interrupts listed when it was read (number -> description): what
    # irq-affinity patterns are checked against; one a device adds later is checked when applied.
    interrupts: Mapping[int, str] = field(default_factory=dict, compare=False)

    @cached_property
    def online(self) -> CPUSet:
        return CPUSet(self.cpus)

    # -- grouping -------------------------------------------------------------------
    def _group(self, key: Callable[[CPU], K]) -> dict[K, CPUSet]:
        """key -> the online CPUs with that key, in key order."""
        out: dict[K, set[int]] = {}
        for c in self.cpus.values():
            out.setdefault(key(c), set()).add(c.id)
        return {k: CPUSet(ids) for k, ids in sorted(out.items())}

    @cached_property
    def packages(self) -> dict[int, CPUSet]:
        return self._group(lambda c: c.package)

    @cached_property
    def dies(self) -> dict[tuple[int, int], CPUSet]:
        return self._group(lambda c: (c.package, c.die))

    @cached_property
    def cores(self) -> dict[tuple[int, int, int], CPUSet]:
        return self._group(lambda c: (c.package, c.die, c.core))

    @cached_property
    def core_of(self) -> dict[int, tuple[int, int, int]]:
        """CPU -> (package, die, core)."""
        return {c.id: (c.package, c.die, c.core) for c in self.cpus.values()}

    @cached_property
    def hybrid(self) -> bool:
        """Whether the CPUs are of more than one core kind."""
        return len({c.kind for c in self.cpus.values()}) > 1

    @cached_property
    def kinds(self) -> dict[CoreKind, CPUSet]:
        """Core kind -> its online CPUs (one UNKNOWN entry on a machine with one kind)."""
        return self._group(lambda c: c.kind)

    def cache_groups(self, level: int) -> list[CPUSet]:
        """The sets of online CPUs that share one cache of a level (2: L2 clusters, 3: L3/uncore
        domains), in order of their first CPU; [] when sysfs listed no cache of that level."""
        groups = {c.cpus for c in self.caches if c.level == level and c.kind != "Instruction" and c.cpus}
        return sorted(groups, key=lambda g: (min(g), g.bits))

    @cached_property
    def l2_of(self) -> dict[int, CPUSet]:
        """CPU -> the CPUs sharing its L2 cache (its core's threads when sysfs lists no L2)."""
        return self._sharing(2)

    @cached_property
    def l3_of(self) -> dict[int, CPUSet]:
        """CPU -> the CPUs sharing its L3 cache (its die's CPUs when sysfs lists no L3)."""
        return self._sharing(3)

    def _sharing(self, level: int) -> dict[int, CPUSet]:
        out = {}
        for group in self.cache_groups(level):
            for cpu in group:
                out[cpu] = group
        for c in self.cpus.values():
            if c.id not in out:
                out[c.id] = c.threads if level <= 2 else self.dies[(c.package, c.die)]
        return out

    @cached_property
    def hierarchy(self) -> tuple[Level, ...]:
        """The levels of the machine that nest, coarse to fine: package, die, NUMA node, L3 and L2
        domains, cores. A level is left out where it adds nothing (the same groups as the level above)
        or does not nest (a NUMA node spanning L3 domains comes after them: sub-NUMA clustering puts
        two nodes in one L3; one L3 per core complex puts several in one node)."""
        candidates = [("package", list(self.packages.values())), ("die", list(self.dies.values())),
                      ("node", list(self._group(lambda c: c.node).values())),
                      ("l3", sorted(set(self.l3_of.values()), key=lambda g: g.bits)),
                      ("l2", sorted(set(self.l2_of.values()), key=lambda g: g.bits)),
                      ("core", list(self.cores.values()))]
        cores = candidates.pop()[1]
        candidates.sort(key=lambda lv: len(lv[1]))  # stable: the nominal order breaks ties
        kept: list[Level] = []
        parents = [self.online]
        for name, groups in candidates + [("core", cores)]:
            if name != "core" and set(groups) in (set(parents), set(cores)):
                continue
            if not all(any(g <= p for p in parents) for g in groups):
                continue
            kept.append(Level(name, tuple(groups)))
            parents = groups
        return tuple(kept)

    def package_nodes(self, package: int) -> list[int]:
        return sorted({c.node for c in self.cpus.values() if c.package == package and c.node >= 0})

    def node_cpus(self, node: int) -> CPUSet:
        n = self.nodes.get(node)
        return n.cpus & self.online if n is not None else EMPTY

    def memory_nodes(self, kind: MemoryType | None = None) -> list[Node]:
        return [n for n in self.nodes.values() if n.memory and (kind is None or n.kind == kind)]

    def describe(self) -> str:
        pk = self.packages
        lines = [f"{len(self.cpus)} online CPUs in {len(pk)} package(s), {len(self.dies)} die(s), "
                 f"{len(self.cores)} core(s), {len(self.nodes)} NUMA node(s)"]
        if self.offline:
            lines.append(f"offline CPUs: {self.offline}")
        if self.isolated:
            lines.append(f"isolated CPUs: {self.isolated}")
        if self.hybrid:
            lines.append("core kinds: " + ", ".join(f"{k} {cpus}" for k, cpus in self.kinds.items()))
            l2 = [g for g in self.cache_groups(2) if len(g) > 1 and g != self.cpus[min(g)].threads]
            if l2:
                lines.append("L2 clusters: " + " ".join(str(g) for g in l2))
        for n in self.nodes.values():
            lines.append(f"node {n.id}: {n.kind} {n.memory >> 20} MiB, CPUs {n.cpus or '-'}")
        return "\n".join(lines)
