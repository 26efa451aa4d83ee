"""A model of kubelet's static CPU manager allocation, for comparison (benchmarks/placement.py).

Written from kubelet's documented algorithm ("takeByTopologyNUMAPacked" and its options), not
from its code:

1. Whole NUMA nodes, or sockets where a node spans sockets, while the request needs at least
   one; with `prefer-align-cpus-by-uncorecache` then whole free L3 (uncore) caches, and the
   rest from the first L3 cache whose free whole cores can hold it.
2. Whole free cores, from the fullest node first (packing).
3. Single threads, from the fullest node and the fullest cores first.

`full-pcpus-only` refuses a request that is not a multiple of the threads per core;
`distribute-cpus-across-numa` spreads a request that does not fit one node evenly over the
fewest nodes that hold it. Only Guaranteed containers with an integer CPU request get exclusive
CPUs; kubelet leaves cpuset.mems alone without the memory manager.
"""

from __future__ import annotations

from dataclasses import dataclass

from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import Topology


class Refused(Exception):
    pass


@dataclass(frozen=True)
class Options:
    full_pcpus_only: bool = False
    distribute_across_numa: bool = False
    align_by_uncore_cache: bool = False

    @property
    def label(self) -> str:
        names = [n for n, on in (("full-pcpus-only", self.full_pcpus_only),
                                 ("distribute-cpus-across-numa", self.distribute_across_numa),
                                 ("prefer-align-cpus-by-uncorecache", self.align_by_uncore_cache)) if on]
        return "kubelet static" + (" +" + ",".join(names) if names else "")


class KubeletStatic:
    def __init__(self, topology: Topology, reserved: int, options: Options) -> None:
        self.topo, self.options = topology, options
        self.threads = max(len(c) for c in topology.cores.values())
        nodes: dict[int, set[int]] = {}
        for c in topology.cpus.values():
            nodes.setdefault(c.node, set()).add(c.id)
        self.nodes = [CPUSet(v) for _, v in sorted(nodes.items())]
        spans = any(len({topology.cpus[c].package for c in n}) > 1 for n in self.nodes)
        sockets = list(topology.packages.values())
        # The coarser level first; a node spanning sockets makes sockets the finer one.
        self.levels = [self.nodes, sockets] if spans else [sockets, self.nodes]
        self.l3 = sorted(set(topology.l3_of.values()), key=lambda g: g.bits)
        self.free = topology.online
        self.reserved = self._packed(topology.online, reserved)  # kubelet reserves the same way
        self.free = topology.online - self.reserved

    def allocate(self, count: int) -> CPUSet:
        if self.options.full_pcpus_only and count % self.threads:
            raise Refused(f"SMTAlignmentError: {count} CPUs is not a multiple of {self.threads} threads per core")
        if count > len(self.free):
            raise Refused(f"not enough CPUs: {count} > {len(self.free)}")
        if self.options.distribute_across_numa and count > max(len(n & self.free) for n in self.nodes):
            got = self._distributed(count)
        else:
            got = self._packed(self.free, count)
        self.free -= got
        return got

    def release(self, cpus: CPUSet) -> None:
        self.free |= cpus

    def _distributed(self, count: int) -> CPUSet:
        ranked = sorted(self.nodes, key=lambda n: (-len(n & self.free), n.bits))
        for k in range(2, len(ranked) + 1):
            share = -(-count // k)
            chosen = ranked[:k]
            if all(len(n & self.free) >= share for n in chosen):
                out, left = EMPTY, count
                for i, n in enumerate(chosen):
                    take = left // (k - i)
                    out |= self._packed(n & self.free, take)
                    left -= take
                return out
        return self._packed(self.free, count)

    def _packed(self, free: CPUSet, count: int) -> CPUSet:
        taken = EMPTY

        def left() -> int:
            return count - len(taken)

        def fullness(group: CPUSet) -> tuple[int, int]:  # fullest first, then lowest IDs
            return len(group & free), group.bits & -group.bits

        for level in self.levels:
            for group in sorted(level, key=fullness):
                if group <= free and left() >= len(group):
                    taken |= group
                    free -= group
        if self.options.align_by_uncore_cache and len(self.l3) > 1:
            for cache in sorted(self.l3, key=fullness):
                if cache <= free and left() >= len(cache):
                    taken |= cache
                    free -= cache
            whole_cores = [c for c in self.topo.cores.values() if c <= free]
            for cache in sorted(self.l3, key=fullness):
                cores = [c for c in whole_cores if c <= cache]
                if left() and sum(len(c) for c in cores) >= left():
                    for c in sorted(cores, key=lambda c: c.bits):
                        if left() >= len(c):
                            taken |= c
                            free -= c
                    break
        node_of = {c: i for i, n in enumerate(self.nodes) for c in n}
        node_free = [len(n & free) for n in self.nodes]
        for core in sorted((c for c in self.topo.cores.values() if c <= free),
                           key=lambda c: (node_free[node_of[min(c)]], c.bits)):
            if left() >= len(core):
                taken |= core
                free -= core
        if left():
            core_of = self.topo.core_of
            cores = self.topo.cores
            rest = sorted(free, key=lambda c: (len(self.nodes[node_of[c]] & free), len(cores[core_of[c]] & free), c))
            taken |= CPUSet(rest[:left()])
        return taken
