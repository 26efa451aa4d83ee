"""podpools' DRA devices (docs/dra.md): each pool instance, `<type>-<index>`, its CPUs the
device's capacity. A claim on one books a pod's place in the instance (counted against MaxPods
until a pod uses it), and the containers using the claim run in the instance, as an annotated
pod's would."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from resmgr.model import Claim
from resmgr.policies.base import PolicyError
from resmgr.policies.toolkit import claims
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.model import Topology


class Instance(Protocol):
    type: str
    index: int
    cpus: CPUSet
    max_pods: int
    pods: set[str]

    @property
    def name(self) -> str: ...


def device_name(i: Instance) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", f"{i.type}-{i.index}".lower()).strip("-")[:63]


class PodpoolDevices:
    def __init__(self, topology: Topology, instances: Iterable[Instance]) -> None:
        self.topology = topology
        self.by_device = {device_name(i): i for i in instances}
        self.book = claims.ClaimBook()
        self.users: dict[str, str] = {}  # container key -> the claim (UID) it runs on

    def attributes(self, i: Instance) -> claims.Attributes:
        return {"kind": "podpool", "poolType": i.type, "instance": i.index,
                **claims.numa_attributes(self.topology, i.cpus)}

    def listed(self) -> list[dict[str, Any]]:
        return [{"name": name, "attributes": self.attributes(i), "cpus": len(i.cpus), "cpuset": str(i.cpus)}
                for name, i in sorted(self.by_device.items())]

    def claim_users(self, uid: str) -> list[str]:
        return sorted(k for k, u in self.users.items() if u == uid)

    def booked(self, i: Instance) -> int:
        """Places in the instance claims hold for pods that have not come yet."""
        return sum(1 for uid, c in self.book.claims.items()
                   if self.by_device.get(c.device) is i and not self.claim_users(uid))

    def full(self, i: Instance) -> bool:
        return bool(i.max_pods) and len(i.pods) + self.booked(i) >= i.max_pods

    def instance_of(self, uid: str) -> Instance:
        return self.by_device[self.book.claims[uid].device]

    def hold(self, claim: Claim) -> None:
        """Book a place in the claim's instance (PolicyError: nothing booked)."""
        i = self.by_device.get(claim.device)
        if i is None:
            raise PolicyError(f"{claim.who}: this node has no device {claim.device} (it offers "
                              f"{', '.join(sorted(self.by_device)) or 'none'})")
        if self.full(i):
            raise PolicyError(f"{claim.who}: pool {i.name} holds its {i.max_pods} pods")
        if claim.cpus > len(i.cpus):
            raise PolicyError(f"{claim.who}: device {claim.device} has {len(i.cpus)} CPU(s), the claim asks "
                              f"for {claim.cpus}")
        self.book.hold(claim, claim.cpus or len(i.cpus))

    def describe(self, uid: str, mems: CPUSet) -> dict[str, Any] | None:
        if uid not in self.book.claims:
            return None
        i = self.instance_of(uid)
        return {**self.book.describe(uid), "pool": i.name, "cpus": str(i.cpus), "mems": str(mems),
                "users": self.claim_users(uid)}

    def export(self) -> dict[str, Any]:
        return {**self.book.export(), **({"claim_users": dict(sorted(self.users.items()))} if self.users else {})}

    def restore(self, data: Mapping[str, Any]) -> None:
        """Persisted claims and their users (PolicyError, nothing kept, if they do not fit these pools)."""
        book = claims.ClaimBook()
        book.restore(data)
        users = {str(k): str(v) for k, v in (data.get("claim_users") or {}).items()}
        for c in book.claims.values():
            if c.device not in self.by_device:
                raise PolicyError(f"{c.who} is held on device {c.device}, which this configuration has not")
        for key, uid in users.items():
            if uid not in book.claims:
                raise PolicyError(f"persisted container {key} runs on claim {uid}, which is not held here now")
        self.book, self.users = book, users
