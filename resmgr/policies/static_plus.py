"""The `static-plus` policy: reserved, isolated and shared pools.

The CPU request decides, whatever the QoS class: kube-system (and other reserved
namespaces) run on the reserved CPUs; requests under one CPU share the shared pool;
whole CPUs go to isolated CPUs when enough are free (unless the container opts out
with prefer-isolated-cpus: "false"), else they are sliced exclusively off the shared
pool; mixed requests get the whole part exclusively plus the shared pool. The shared
pool keeps enough CPUs for what its users request. When exclusive grants take all of
it, its users (who then request no CPU time) run on the reserved CPUs, as kubelet's
shared pool does, until shared CPUs come free; without reserved CPUs it keeps one CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resmgr.model import Container, Pod
from resmgr.policies.base import PolicyError
from resmgr.policies.pools import DRA_DEVICES, PoolPolicy, grant_in
from resmgr.policies.toolkit import cpuvalues
from resmgr.policies.toolkit.allocator import preferences, take_cpus
from resmgr.policies.toolkit.annotations import prefer_isolated
from resmgr.policies.toolkit.grants import Grant
from resmgr.policies.toolkit.options import Option, in_namespaces, reserved_namespaces
from resmgr.requests import Requirements
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import Topology

RESERVED, SHARED = "reserved", "shared"


class StaticPlusPolicy(PoolPolicy):
    name = "static-plus"
    description = ("reserved, isolated and shared pools: exclusive CPUs for any whole-CPU request, "
                   "isolated CPUs first, kube-system on reserved CPUs")
    options = (Option("ReservedPoolNamespaces", "strings", None, "namespaces (globs) on the reserved CPUs "
                      "besides kube-system, which always is (policy.ReservedPoolNamespaces wins)"), DRA_DEVICES)

    def __init__(self, config: Mapping[str, Any] | None = None, topology: Topology | None = None) -> None:
        super().__init__(config, topology)
        options = self.read_options()
        cpus = cpuvalues.resolve_cpus(self.config, topology)
        available, self.isolated, self.reserved = cpus.available, cpus.isolated, cpus.reserved
        self.shared_base = cpus.general - self.reserved
        if not self.shared_base:
            raise PolicyError("static-plus: no CPUs left for the shared pool "
                              f"(available {available}, isolated {self.isolated}, reserved {self.reserved})")
        namespaces = self.config.get("ReservedPoolNamespaces", options["ReservedPoolNamespaces"])
        self.reserved_namespaces = reserved_namespaces(namespaces)

    def pool_cpus(self) -> dict[str, CPUSet]:
        taken = self.taken()
        return {RESERVED: self.reserved, SHARED: (self.shared_base - taken) or self.reserved,
                "isolated": self.isolated - taken}

    def pool_bases(self) -> dict[str, CPUSet]:
        return {RESERVED: self.reserved, SHARED: self.shared_base, "isolated": self.isolated}

    def reserved_cpus(self) -> CPUSet:
        return self.reserved

    def exclusive_base(self) -> CPUSet:
        return self.isolated | self.shared_base

    def exclusive_sources(self) -> list[tuple[CPUSet, int]]:
        taken = self.taken()
        return [(self.isolated - taken, 0), (self.shared_base - taken, self._shared_need())]

    def _shared_need(self, milli: int = 0) -> int:
        """CPUs the shared pool must keep for its users' requests (and milli more); one at least
        without reserved CPUs to fall back on."""
        milli += sum(g.shared for g in self.grants.values() if g.pool == SHARED)
        need = -(-milli // 1000)
        return need if self.reserved else max(need, 1)

    def shared_elsewhere(self) -> dict[str, int]:
        if self.shared_base - self.taken():
            return {}
        users = sum(1 for g in self.grants.values() if g.pool == SHARED)
        return {SHARED: users} if users else {}

    def fallback(self) -> list[str]:
        return [f"exclusive grants hold every shared CPU: the shared containers run on the reserved CPUs "
                f"{self.reserved}"] if self.shared_elsewhere() else []

    def place(self, container: Container, pod: Pod, req: Requirements, held: CPUSet = EMPTY) -> Grant:
        who = f"container {pod.namespace}/{pod.name}/{container.name}"
        if in_namespaces(pod.namespace, self.reserved_namespaces):
            return grant_in(RESERVED if self.reserved else SHARED, milli=req.cpu_request)
        count = req.whole_cpus
        if count == 0:
            return grant_in(SHARED, milli=req.cpu_request)
        prefer = preferences(container, pod, self.topology, avoid=held)
        taken = self.taken()
        free_isolated = self.isolated - taken
        pool = SHARED if req.fraction else ""
        if prefer_isolated(container, pod) is not False and len(free_isolated) >= count:
            return grant_in(pool, take_cpus(self.topology, free_isolated, count, prefer), req.cpu_request)
        shared = self.shared_base - taken
        need = self._shared_need(req.fraction if pool else 0)
        if len(shared) - need < count:
            raise PolicyError(f"{who} needs {count} exclusive CPUs; the shared pool has {len(shared)} "
                              f"({shared or 'none'}) and must keep {need} for its users")
        return grant_in(pool, take_cpus(self.topology, shared, count, prefer), req.cpu_request)
