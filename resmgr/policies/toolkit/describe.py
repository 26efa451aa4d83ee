"""The pool entries of Policy.describe_pools, one shape for every policy."""

from __future__ import annotations

from typing import Any

from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import Topology


def pool_entry(topology: Topology, name: str, cpus: CPUSet, shared: CPUSet, *, parent: str = "",
               reserved: CPUSet = EMPTY, isolated: CPUSet = EMPTY, exclusive_grants: int = 0, containers: int = 0,
               requested: int = 0, free: int = 0, elsewhere: int = 0, **extra: Any) -> dict[str, Any]:
    """A pool: its CPUs and those its shared users run on now, the memory nodes of its CPUs and
    their memory by type, and its counts (requested/free: shared milli-CPU); extra fields as given."""
    nodes = [n for n in topology.nodes.values() if n.cpus & cpus]
    memory: dict[str, int] = {}
    for n in nodes:
        memory[n.kind.value] = memory.get(n.kind.value, 0) + n.memory
    return {"name": name, "parent": parent, "cpus": str(cpus), "shared": str(shared), "reserved": str(reserved),
            "isolated": str(isolated), "mems": str(CPUSet(n.id for n in nodes)), "memory": memory,
            "exclusive_grants": exclusive_grants, "containers": containers, "shared_milli_requested": requested,
            "shared_milli_free": free, "shared_elsewhere": elsewhere, **extra}
