"""topology-aware's DRA devices (docs/dra.md): each NUMA node or L3 domain of the tree offered as a
device, and the CPUs a prepared claim holds there, as a grant of its own (keyed claims.key(uid))
sliced off the device's pool."""

from __future__ import annotations

from typing import Any

from resmgr.model import Claim
from resmgr.policies.base import PolicyError
from resmgr.policies.toolkit import claims
from resmgr.policies.toolkit.allocator import ANY
from resmgr.policies.toolkit.grants import Grant
from resmgr.policies.topology_aware.accounts import Accounts
from resmgr.policies.topology_aware.placement import Placement
from resmgr.policies.topology_aware.tree import Pool, devices
from resmgr.topology.model import Topology

MAX_COUNTERS = 32  # per counter set (resource.k8s.io/v1)


def counters(offered: dict[str, tuple[Pool, claims.Attributes]]) -> dict[str, dict]:
    """What each device consumes of the shared counters (KEP-4815) by name: {set: {counter: CPUs}}.
    A NUMA node's device and its L3 domains' overlap, so each L3 domain is a counter (its CPUs) both
    consume, and the scheduler never allocates the node and one of its domains at once. One counter
    set per package (a device may consume from one); a package of more domains than a set holds
    gets none."""
    by_package: dict[int, list[tuple[str, Pool, claims.Attributes]]] = {}
    for name, (pool, attrs) in offered.items():
        if attrs["kind"] == "l3":
            by_package.setdefault(int(attrs["package"]), []).append((name, pool, attrs))
    out: dict[str, dict] = {}
    for package, domains in by_package.items():
        if len(domains) > MAX_COUNTERS:
            continue
        cset = f"package-{package}"
        for name, pool, attrs in domains:
            out[name] = {cset: {name: len(pool.cpus)}}
            numa = f"numa-{attrs['numaNode']}"
            if numa in offered and pool.cpus <= offered[numa][0].cpus:
                out.setdefault(numa, {cset: {}})[cset][name] = len(pool.cpus)
    return out


class Devices:
    def __init__(self, topology: Topology, pools: list[Pool], accounts: Accounts, placement: Placement) -> None:
        self.offered = devices(topology, pools)
        self.consumes = counters(self.offered)
        self.accounts, self.placement = accounts, placement
        self.book = claims.ClaimBook()

    def users(self, uid: str) -> list[str]:
        """The containers running on the claim's CPUs."""
        return sorted(k for k, g in self.accounts.grants.items() if g.claim == uid)

    def pool_of(self, uid: str) -> Pool:
        return self.accounts.by_name[self.accounts.grants[claims.key(uid)].pool]

    def listed(self) -> list[dict[str, Any]]:
        """The devices with the CPUs each can still give (what its claims hold counted in)."""
        out = []
        grants = self.accounts.grants
        for name, (pool, attrs) in self.offered.items():
            held = sum(len(grants[claims.key(u)].exclusive) for u, c in self.book.claims.items()
                       if c.device == name and claims.key(u) in grants)
            doc = {"name": name, "attributes": attrs, "cpus": held + self.accounts.claim_room(pool),
                   "cpuset": str(pool.cpus)}
            if name in self.consumes:
                doc["consumes"] = self.consumes[name]
            out.append(doc)
        return out

    def hold(self, claim: Claim) -> None:
        """Take the claim's CPUs off its device's pool (PolicyError: nothing taken)."""
        if claim.device not in self.offered:
            raise PolicyError(f"{claim.who}: this node has no device {claim.device} (it offers "
                              f"{', '.join(self.offered) or 'none'})")
        pool = self.offered[claim.device][0]
        room = self.accounts.claim_room(pool)
        count = claim.cpus or room
        if count <= 0 or count > room:
            raise PolicyError(f"{claim.who}: device {claim.device} can give {room} CPU(s), the claim asks "
                              f"for {count}")
        grants = self.accounts.grants
        with grants.transaction():
            grants.add(claims.key(claim.uid), Grant(pool.name, self.placement.slice(pool, count, ANY),
                                                    milli=1000 * count))
            problem = self.accounts.overcommitted()
            if problem:
                raise PolicyError(f"{claim.who}: {problem}")
        self.book.hold(claim, count)

    def give_back(self, uid: str) -> None:
        self.accounts.grants.remove(claims.key(uid))
        self.book.drop(uid)

    def describe(self, uid: str) -> dict[str, Any] | None:
        held = self.accounts.grants.get(claims.key(uid))
        if uid not in self.book.claims or held is None:
            return None
        pool = self.accounts.by_name[held.pool]
        return {**self.book.describe(uid), "cpus": str(held.exclusive), "mems": str(pool.all_mems),
                "users": self.users(uid)}

