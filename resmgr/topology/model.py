"""An immutable snapshot of the machine: CPUs, packages, dies, cores, NUMA nodes, caches."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from resmgr.topology.cpuset import EMPTY, CPUSet


class MemoryType(StrEnum):
    DRAM = "dram"
    PMEM = "pmem"
    HBM = "hbm"


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
class Topology:
    cpus: Mapping[int, CPU]  # online CPUs only
    offline: CPUSet
    isolated: CPUSet
    nodes: Mapping[int, Node]
    caches: tuple[Cache, ...] = ()

    @cached_property
    def online(self) -> CPUSet:
        return CPUSet(self.cpus)

    # -- grouping -------------------------------------------------------------------
    @cached_property
    def packages(self) -> dict[int, CPUSet]:
        out: dict[int, set[int]] = {}
        for c in self.cpus.values():
            out.setdefault(c.package, set()).add(c.id)
        return {p: CPUSet(ids) for p, ids in sorted(out.items())}

    @cached_property
    def dies(self) -> dict[tuple[int, int], CPUSet]:
        out: dict[tuple[int, int], set[int]] = {}
        for c in self.cpus.values():
            out.setdefault((c.package, c.die), set()).add(c.id)
        return {k: CPUSet(ids) for k, ids in sorted(out.items())}

    @cached_property
    def cores(self) -> dict[tuple[int, int, int], CPUSet]:
        out: dict[tuple[int, int, int], set[int]] = {}
        for c in self.cpus.values():
            out.setdefault((c.package, c.die, c.core), set()).add(c.id)
        return {k: CPUSet(ids) for k, ids in sorted(out.items())}

    @cached_property
    def core_of(self) -> dict[int, tuple[int, int, int]]:
        """CPU -> (package, die, core)."""
        return {c.id: (c.package, c.die, c.core) for c in self.cpus.values()}

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
        for n in self.nodes.values():
            lines.append(f"node {n.id}: {n.kind} {n.memory >> 20} MiB, CPUs {n.cpus or '-'}")
        return "\n".join(lines)
