"""DRA claims in a policy: the grant key of a claim's own CPUs, which claim a container uses, how
the containers sharing one split its CPU time, and the bookkeeping every policy offering devices
shares (ClaimBook) (docs/dra.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, Generic, Protocol, TypeVar

from resmgr.model import Claim, Container, Decision, Pod, Resources, View
from resmgr.policies.toolkit.errors import PolicyError
from resmgr.requests import milli_to_shares
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.model import Topology

PREFIX = "claim:"
S = TypeVar("S")
# Kubernetes' standard attribute (KEP-6072): another driver's device on the same NUMA node matches it.
NUMA_NODE = "resource.kubernetes.io/numaNode"
# A device's attributes; a list only as the standard attribute of a device spanning NUMA nodes.
Attributes = dict[str, int | str | list[int]]


def numa_attributes(topology: Topology, cpus: CPUSet) -> Attributes:
    """A device's NUMA node, its package and the standard attribute, when its CPUs are all on one
    NUMA node; else the nodes it spans as a list, which only clusters taking list attributes
    (DRAListTypeAttributes) are sent: no scalar says "the same node" for such a device."""
    nodes = sorted({topology.cpus[c].node for c in cpus})
    if len(nodes) != 1:
        return {NUMA_NODE: nodes} if nodes else {}
    return {"numaNode": nodes[0], "package": topology.cpus[min(cpus)].package, NUMA_NODE: nodes[0]}


def key(uid: str) -> str:
    """The grant key of a claim's own CPUs (never a container's)."""
    return PREFIX + uid


def is_claim(grant_key: str) -> bool:
    return grant_key.startswith(PREFIX)


def claim_of(container: Container, pod: Pod, claims: Mapping[str, Claim]) -> Claim | None:
    """The prepared claim the container runs on; None: it uses no claim. PolicyError when it uses
    several (one container, one set of CPUs) or one this node has not prepared."""
    if not container.claims:
        return None
    who = f"container {pod.namespace}/{pod.name}/{container.name}"
    if len(set(container.claims)) > 1:
        named = [claims[u].who if u in claims else f"claim {u}" for u in sorted(set(container.claims))]
        raise PolicyError(f"{who} uses {' and '.join(named)}: a container can take its CPUs from one claim only")
    uid = container.claims[0]
    claim = claims.get(uid)
    if claim is None:
        raise PolicyError(f"{who} uses claim {uid}, which is not prepared on this node")
    return claim


def shares(cpus: int, users: int) -> int:
    """Each user's CPU shares: the claim's CPUs split evenly among the containers using it."""
    return milli_to_shares(1000 * cpus // max(users, 1))


def restore(data: Mapping[str, Any]) -> tuple[dict[str, Claim], dict[str, int], set[str]]:
    """Persisted claims as kubelet prepared them, the CPUs each holds, and the UIDs unprepared while
    containers still used them. `cpus` is what a claim holds (what 0.1.0 writes and reads); `asked`,
    where written, what it asked for (0: the whole device)."""
    claims, held = {}, {}
    for uid, d in (data.get("claims") or {}).items():
        claim = Claim.from_dict(d)
        held[uid] = claim.cpus
        claims[uid] = replace(claim, cpus=d.get("asked", claim.cpus))
    return claims, held, set(data.get("unprepared") or ()) & set(claims)


def export(claims: Mapping[str, Claim], held: Mapping[str, int], unprepared: Iterable[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if claims:
        out["claims"] = {uid: {**c.to_dict(), "cpus": held[uid], "asked": c.cpus} for uid, c in sorted(claims.items())}
    if unprepared:
        out["unprepared"] = sorted(unprepared)
    return out


class ClaimBook:
    """The one record of a policy's DRA claims: those kubelet prepared (as it asked), the CPUs each
    holds, and those kubelet unprepared while containers still run on their CPUs (given back when
    the last of them goes). The policy holds the CPUs; the book says when to take and when to give
    them back. The engine asks it (Policy.prepared_claims) what to persist and to prepare again
    under another policy."""

    def __init__(self) -> None:
        self.claims: dict[str, Claim] = {}  # held, as kubelet prepared them
        self.held: dict[str, int] = {}  # the number of CPUs each holds
        self.unprepared: set[str] = set()

    def usable(self) -> dict[str, Claim]:
        """Claims kubelet prepared and has not unprepared: a new container may run on them."""
        return {u: c for u, c in self.claims.items() if u not in self.unprepared}

    def is_new(self, claim: Claim) -> bool:
        """Whether the claim's CPUs are to be taken: False when it is held already (prepared again
        after kubelet unprepared it while in use, it is in use again). PolicyError: held on another device."""
        held = self.claims.get(claim.uid)
        if held is None:
            return True
        if held.device != claim.device:
            raise PolicyError(f"{claim.who} is prepared on device {held.device}, not {claim.device}")
        self.unprepared.discard(claim.uid)
        return False

    def hold(self, claim: Claim, cpus: int) -> None:
        self.claims[claim.uid] = claim
        self.held[claim.uid] = cpus

    def give_back_now(self, uid: str, users: list[str]) -> bool:
        """kubelet unprepared the claim: whether its CPUs go now (False: none held, or containers
        still run on them and they go with the last, see last_user_gone)."""
        if uid not in self.claims:
            return False
        if users:
            self.unprepared.add(uid)
            return False
        return True

    def last_user_gone(self, uid: str, users: list[str]) -> bool:
        """A container on the claim went: whether the claim's CPUs go now (unprepared, nobody left)."""
        return not users and uid in self.unprepared

    def drop(self, uid: str) -> None:
        self.claims.pop(uid, None)
        self.held.pop(uid, None)
        self.unprepared.discard(uid)

    def describe(self, uid: str) -> dict[str, Any]:
        claim = self.claims[uid]
        return {"device": claim.device, "unprepared": uid in self.unprepared}

    def export(self) -> dict[str, Any]:
        return export(self.claims, self.held, self.unprepared)

    def restore(self, data: Mapping[str, Any]) -> None:
        self.claims, self.held, self.unprepared = restore(data)

    def clear(self) -> None:
        self.claims, self.held, self.unprepared = {}, {}, set()


class HeldDevices(Protocol):
    """A policy's devices that hold claims' CPUs off its pools (topology-aware's, static's)."""

    book: ClaimBook

    def users(self, uid: str) -> list[str]: ...

    def hold(self, claim: Claim) -> None: ...

    def give_back(self, uid: str) -> None: ...


class Preparing(Generic[S]):
    """prepare_claim and unprepare_claim of a policy whose claims take CPUs off its pools: the
    claim's CPUs held or given back, the users of the pools that changed moved. snapshot: the
    pools before; updates(before, view, skip): the users whose pools changed since."""

    def __init__(self, devices: HeldDevices, snapshot: Callable[[], S],
                 updates: Callable[[S, View, str], dict[str, Resources]]) -> None:
        self.devices, self.snapshot, self.updates = devices, snapshot, updates

    def prepare(self, claim: Claim, view: View) -> Decision:
        if not self.devices.book.is_new(claim):
            return Decision()
        before = self.snapshot()
        self.devices.hold(claim)
        return Decision(updates=self.updates(before, view, ""))

    def unprepare(self, uid: str, view: View) -> Decision:
        """Give the claim's CPUs back, or, while containers run on them, once the last one goes."""
        if not self.devices.book.give_back_now(uid, self.devices.users(uid)):
            return Decision()
        before = self.snapshot()
        self.devices.give_back(uid)
        return Decision(updates=self.updates(before, view, ""))
