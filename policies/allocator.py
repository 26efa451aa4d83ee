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

    def package_ranks() -> dict[int, tuple[int, int, int]]:
        return {p: (0 if taken & cpus else 1, len(free & cpus), p) for p, cpus in packages.items()}

    # 2. Whole idle cores, grouped by package in preference order.
    cores = topology.cores
    ranks = package_ranks()
    idle = sorted((key for key, cpus in cores.items() if cpus <= free), key=lambda k: (ranks[k[0]], k))
    for key in idle:
        cpus = cores[key]
        if count - len(taken) >= len(cpus):
            taken |= cpus
            free -= cpus
            if len(taken) == count:
                return taken

    # 3. Single threads: same package preference; within it, cores with fewer free threads
    #    first, so idle cores stay whole.
    ranks = package_ranks()
    core_of = topology.core_of
    free_in_core = {key: len(cpus & free) for key, cpus in cores.items()}
    remaining = sorted(free, key=lambda c: (ranks[core_of[c][0]], free_in_core[core_of[c]], c))
    return taken | CPUSet(remaining[:count - len(taken)])
