"""static's and static-plus' DRA devices (docs/dra.md), by the policy's DRADevices option: one per
NUMA node whose CPUs exclusive grants may take (`numa`: `numa-<id>`, as dra-driver-cpu's grouped
mode), one per CPU (`cpu`: `cpu-<id>`, as its individual mode) or one per whole core (`core`:
`core-<first CPU>`). A claim on one holds that many of its CPUs exclusively (all of a CPU or core
device), as a grant of its own (keyed claims.key(uid)) taken where a Guaranteed container's would
be: the isolated CPUs first, then the shared pool's, each keeping what it must. The containers
using the claim run on those CPUs and split their CPU time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from resmgr.model import Claim
from resmgr.policies.base import PolicyError
from resmgr.policies.toolkit import claims
from resmgr.policies.toolkit.allocator import ANY, take_cpus
from resmgr.policies.toolkit.grants import Grant, Grants
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import Topology

MODES = ("numa", "core", "cpu")
Sources = Callable[[], list[tuple[CPUSet, int]]]  # free CPU sets exclusive grants take from, each with its spare


class PoolDevices:
    def __init__(self, topology: Topology, grants: Grants, sources: Sources, exclusive_cpus: CPUSet,
                 mode: str = "numa") -> None:
        self.topology, self.grants, self.sources = topology, grants, sources
        self.whole = mode != "numa"  # a claim takes all of a CPU or core device, some of a node's
        self.book = claims.ClaimBook()
        self.offered = offer(topology, exclusive_cpus, mode)

    def users(self, uid: str) -> list[str]:
        return sorted(k for k, g in self.grants.items() if g.claim == uid)

    def cpus(self, uid: str) -> CPUSet:
        held = self.grants.get(claims.key(uid))
        return held.exclusive if held is not None else EMPTY

    def room(self, cpus: CPUSet) -> int:
        """CPUs of the set one claim can take now: the most any one source gives there (for a
        device taken whole, all of it or none)."""
        if self.whole:
            return len(cpus) if self._source(cpus, len(cpus)) is not None else 0
        return max((min(len(free & cpus), len(free) - spare) for free, spare in self.sources()), default=0)

    def _source(self, cpus: CPUSet, count: int) -> CPUSet | None:
        """The free CPUs of the set one source gives `count` of, keeping its spare; None: none does."""
        for free, spare in self.sources():
            mine = free & cpus
            if count and len(mine) >= count and len(free) - count >= spare and (not self.whole or mine == cpus):
                return mine
        return None

    def listed(self) -> list[dict[str, Any]]:
        out = []
        for name, (cpus, attrs) in self.offered.items():
            held = sum(len(self.cpus(u)) for u, c in self.book.claims.items() if c.device == name)
            out.append({"name": name, "attributes": attrs, "cpus": held + max(self.room(cpus), 0),
                        "cpuset": str(cpus)})
        return out

    def hold(self, claim: Claim) -> None:
        """Take the claim's CPUs (PolicyError: nothing taken)."""
        if claim.device not in self.offered:
            raise PolicyError(f"{claim.who}: this node has no device {claim.device} (it offers "
                              f"{', '.join(self.offered) or 'none'})")
        cpus = self.offered[claim.device][0]
        room = max(self.room(cpus), 0)
        count = len(cpus) if self.whole and claim.cpus <= len(cpus) else claim.cpus or room
        source = self._source(cpus, count)
        if source is None:
            raise PolicyError(f"{claim.who}: device {claim.device} can give {room} CPU(s), the claim asks "
                              f"for {count}")
        self.grants.add(claims.key(claim.uid), Grant("", take_cpus(self.topology, source, count, ANY),
                                                     milli=1000 * count))
        self.book.hold(claim, count)

    def give_back(self, uid: str) -> None:
        self.grants.remove(claims.key(uid))
        self.book.drop(uid)

    def describe(self, uid: str) -> dict[str, Any] | None:
        if uid not in self.book.claims or claims.key(uid) not in self.grants:
            return None
        cpus = self.cpus(uid)
        mems = CPUSet(n.id for n in self.topology.nodes.values() if n.cpus & cpus)
        return {**self.book.describe(uid), "cpus": str(cpus), "mems": str(mems), "users": self.users(uid)}


def offer(topology: Topology, exclusive: CPUSet, mode: str) -> dict[str, tuple[CPUSet, claims.Attributes]]:
    """The devices of a mode by name: their CPUs and attributes. A core is offered only whole (none
    of its threads reserved or unavailable)."""
    out: dict[str, tuple[CPUSet, claims.Attributes]] = {}
    if mode == "numa":
        for node in sorted(topology.nodes.values(), key=lambda n: n.id):
            cpus = node.cpus & exclusive
            if cpus:
                out[f"numa-{node.id}"] = (cpus, {"kind": "numa", **claims.numa_attributes(topology, cpus)})
        return out
    groups = ([CPUSet((c,)) for c in exclusive] if mode == "cpu" else
              sorted((t for t in topology.cores.values() if t <= exclusive), key=min))
    for cpus in groups:
        first = topology.cpus[min(cpus)]
        attrs: claims.Attributes = {"kind": mode, "coreID": first.core, "die": first.die}
        if mode == "cpu":
            attrs["cpuID"] = first.id
        if first.kind:
            attrs["coreType"] = str(first.kind)
        out[f"{mode}-{first.id}"] = (cpus, {**attrs, **claims.numa_attributes(topology, cpus)})
    return out
