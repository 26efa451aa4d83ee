"""The `static` policy: kubelet's CPU manager static policy.

Available CPUs are the online ones minus isolated ones (narrowed by AvailableResources);
reserved CPUs are part of the shared default set. Guaranteed containers with an integer
CPU request get exclusive CPUs out of (default set - reserved), from the isolated CPUs
when preferred; every other container runs on the default set, which shrinks and grows
as exclusive grants come and go.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resmgr.model import Container, Pod, QOSClass
from resmgr.policies.base import PolicyError
from resmgr.policies.pools import DRA_DEVICES, PoolPolicy, grant_in
from resmgr.policies.toolkit import cpuvalues
from resmgr.policies.toolkit.allocator import preferences, take_cpus
from resmgr.policies.toolkit.annotations import prefer_isolated
from resmgr.policies.toolkit.grants import Grant
from resmgr.policies.toolkit.options import Option
from resmgr.requests import Requirements
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import Topology

DEFAULT = "default"


class StaticPolicy(PoolPolicy):
    name = "static"
    description = ("kubelet CPU manager static policy: exclusive CPUs for Guaranteed integer requests, "
                   "a shared default set for the rest")
    options = (Option("RelaxedIsolation", "boolean", False, "exclusive CPUs from the isolated ones first, "
                      "whatever the count"), DRA_DEVICES)

    def __init__(self, config: Mapping[str, Any] | None = None, topology: Topology | None = None) -> None:
        super().__init__(config, topology)
        self.relaxed = self.read_options()["RelaxedIsolation"]
        cpus = cpuvalues.resolve_cpus(self.config, topology)
        self.available, self.isolated, self.reserved = cpus.general, cpus.isolated, cpus.reserved

    def pool_cpus(self) -> dict[str, CPUSet]:
        taken = self.taken()
        return {DEFAULT: self.available - taken, "isolated": self.isolated - taken}

    def pool_bases(self) -> dict[str, CPUSet]:
        return {DEFAULT: self.available, "isolated": self.isolated}

    def reserved_cpus(self) -> CPUSet:
        return self.reserved

    def exclusive_base(self) -> CPUSet:
        return self.isolated | (self.available - self.reserved)

    def exclusive_sources(self) -> list[tuple[CPUSet, int]]:
        taken = self.taken()
        return [(self.isolated - taken, 0), (self.available - taken - self.reserved, 0 if self.reserved else 1)]

    def place(self, container: Container, pod: Pod, req: Requirements, held: CPUSet = EMPTY) -> Grant:
        if req.qos != QOSClass.GUARANTEED or req.cpu_request <= 0 or req.fraction:
            return grant_in(DEFAULT, milli=req.cpu_request)
        count = req.whole_cpus
        prefer = preferences(container, pod, self.topology, avoid=held)
        taken = self.taken()
        free_isolated = self.isolated - taken
        preferred = prefer_isolated(container, pod)
        want_isolated = preferred if preferred is not None else (
            self.relaxed or (count == 1 and bool(self.isolated)))
        if want_isolated and len(free_isolated) >= count:
            return grant_in("", take_cpus(self.topology, free_isolated, count, prefer), req.cpu_request)
        free = self.available - taken - self.reserved
        # Without reserved CPUs the default set must keep one CPU: an empty cpuset would
        # mean "any CPU" to the runtime.
        spare = 0 if self.reserved else 1
        if len(free) - spare < count:
            raise PolicyError(f"container {pod.namespace}/{pod.name}/{container.name} needs {count} exclusive "
                              f"CPUs; only {max(len(free) - spare, 0)} can be given ({free or 'none'} free)")
        return grant_in("", take_cpus(self.topology, free, count, prefer), req.cpu_request)
