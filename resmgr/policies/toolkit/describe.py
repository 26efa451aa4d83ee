"""The pool entries of Policy.describe_pools, one shape for every policy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import Topology


def pool_entry(topology: Topology, name: str, cpus: CPUSet, shared: CPUSet, *, parent: str = "",
               reserved: CPUSet = EMPTY, isolated: CPUSet = EMPTY, exclusive_grants: int = 0, containers: int = 0,
               requested: int = 0, free: int = 0, elsewhere: int = 0, mems: CPUSet | None = None,
               memory: Mapping[str, int] | None = None, **extra: Any) -> dict[str, Any]:
    """A pool: its CPUs and those its shared users run on now, its memory nodes and their memory by
    type (unless given: those of its CPUs), and its counts (requested/free: shared milli-CPU);
    extra fields as given."""
    if mems is None:
        mems = CPUSet(n.id for n in topology.nodes.values() if n.cpus & cpus)
    if memory is None:
        by_type: dict[str, int] = {}
        for n in (topology.nodes[i] for i in mems):
            by_type[n.kind.value] = by_type.get(n.kind.value, 0) + n.memory
        memory = by_type
    return {"name": name, "parent": parent, "cpus": str(cpus), "shared": str(shared), "reserved": str(reserved),
            "isolated": str(isolated), "mems": str(mems), "memory": dict(memory),
            "exclusive_grants": exclusive_grants, "containers": containers, "shared_milli_requested": requested,
            "shared_milli_free": free, "shared_elsewhere": elsewhere, **extra}
