"""Topology-compact CPU allocation, shared by the policies.

Picks N CPUs out of an available set the way kubelet's CPU manager does: whole idle
packages first, then whole idle cores, then single threads; at each step preferring
packages this allocation already uses, then packages with fewer free CPUs (so big
free blocks stay whole), then lower IDs. Deterministic for the same inputs.
"""

from __future__ import annotations

from resmgr.topology.cpuset import CPUSet
from resmgr.topology.model import Topology


class AllocationError(Exception):
    pass


def take_cpus(topology: Topology, available: CPUSet, count: int) -> CPUSet:
    if count < 0:
        raise AllocationError(f"cannot take {count} CPUs")
    if count > len(available):
        raise AllocationError(f"need {count} CPUs, only {len(available)} available ({available or 'none'})")
    if count == 0:
        return CPUSet()
    packages = topology.packages
    taken = CPUSet()
    free = available

    # 1. Whole idle packages.
    for cpus in packages.values():
        if count - len(taken) >= len(cpus) and cpus <= free:
            taken |= cpus
            free -= cpus
    if len(taken) == count:
        return taken

    def package_rank(pkg: int) -> tuple[int, int, int]:
        return (0 if taken & packages[pkg] else 1, len(free & packages[pkg]), pkg)

    # 2. Whole idle cores, grouped by package in preference order.
    cores = topology.cores
    idle = [(key, cpus) for key, cpus in cores.items() if cpus <= free]
    idle.sort(key=lambda kc: (package_rank(kc[0][0]), kc[0]))
    for _, cpus in idle:
        if count - len(taken) >= len(cpus) and cpus <= free:
            taken |= cpus
            free -= cpus
        if len(taken) == count:
            return taken

    # 3. Single threads: same package preference; within it, cores with fewer free threads
    #    first, so idle cores stay whole.
    core_of = {cpu: key for key, cpus in cores.items() for cpu in cpus}
    remaining = sorted(free, key=lambda c: (package_rank(core_of[c][0]) if c in core_of else (1, 0, 0),
                                           len(cores[core_of[c]] & free) if c in core_of else 0, c))
    return taken | CPUSet(remaining[:count - len(taken)])
