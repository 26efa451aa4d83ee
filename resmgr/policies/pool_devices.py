"""static's and static-plus' DRA devices (docs/dra.md): one per NUMA node whose CPUs exclusive
grants may take (`numa-<id>`, as dra-driver-cpu groups CPUs by NUMA node). A claim on one holds
that many of its CPUs exclusively, as a grant of its own (keyed claims.key(uid)) taken where a
Guaranteed container's would be: the isolated CPUs first, then the shared pool's, each keeping what
it must. The containers using the claim run on those CPUs and split their CPU time."""

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

Sources = Callable[[], list[tuple[CPUSet, int]]]  # free CPU sets exclusive grants take from, each with its spare


class PoolDevices:
    def __init__(self, topology: Topology, grants: Grants, sources: Sources, exclusive_cpus: CPUSet) -> None:
        self.topology, self.grants, self.sources = topology, grants, sources
        self.book = claims.ClaimBook()
        self.offered: dict[str, tuple[CPUSet, dict[str, int | str]]] = {}
        for node in sorted(topology.nodes.values(), key=lambda n: n.id):
            cpus = node.cpus & exclusive_cpus
            if cpus:
                self.offered[f"numa-{node.id}"] = (cpus, {"kind": "numa", **claims.numa_attributes(topology, cpus)})

    def users(self, uid: str) -> list[str]:
        return sorted(k for k, g in self.grants.items() if g.claim == uid)

    def cpus(self, uid: str) -> CPUSet:
        held = self.grants.get(claims.key(uid))
        return held.exclusive if held is not None else EMPTY

    def room(self, cpus: CPUSet) -> int:
        """CPUs of the set one claim can take now: the most any one source gives there."""
        return max((min(len(free & cpus), len(free) - spare) for free, spare in self.sources()), default=0)

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
        count = claim.cpus or room
        source = next((free & cpus for free, spare in self.sources()
                       if count and len(free & cpus) >= count and len(free) - count >= spare), None)
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
