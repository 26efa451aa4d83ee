"""What the balloons policy holds: balloons of a type, and the containers (members) in each."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from resmgr.model import Container, Pod
from resmgr.policies.balloons.types import BalloonType
from resmgr.policies.toolkit import annotations
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import MemoryType

BALLOON = "balloon.balloons"


@dataclass(frozen=True)
class Member:
    """A container in a balloon."""
    milli: int
    pod: str
    namespace: str
    hide_ht: bool = False
    pin_cpu: bool = True
    pin_memory: bool = True
    mem_types: frozenset[MemoryType] = frozenset()
    wanted: str = ""  # the type it belongs to, when it runs on the reserved CPUs for want of room there
    claim: str = ""  # the DRA claim (UID) it runs on (a claim's own entry, keyed claims.key(uid): "")

    def to_dict(self) -> dict[str, Any]:
        d = {"milli": self.milli, "pod": self.pod, "namespace": self.namespace, "hide_ht": self.hide_ht,
             "pin_cpu": self.pin_cpu, "pin_memory": self.pin_memory,
             "mem_types": sorted(t.value for t in self.mem_types), "wanted": self.wanted}
        if self.claim:
            d["claim"] = self.claim
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Member:
        return cls(int(d["milli"]), str(d["pod"]), str(d["namespace"]), bool(d.get("hide_ht", False)),
                   bool(d.get("pin_cpu", True)), bool(d.get("pin_memory", True)),
                   frozenset(MemoryType(t) for t in d.get("mem_types", [])), str(d.get("wanted", "")),
                   str(d.get("claim", "")))


@dataclass(eq=False)
class Balloon:
    type: BalloonType
    index: int
    cpus: CPUSet = EMPTY  # its own CPUs (none for a type on the reserved CPUs)
    group: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    parts: list[Balloon] = field(default_factory=list)  # a composite's hidden component balloons

    @property
    def leaves(self) -> list[Balloon]:
        """The balloons that hold CPUs themselves: itself, or its parts' leaves."""
        return [x for p in self.parts for x in p.leaves] if self.parts else [self]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": self.type.name, "index": self.index, "cpus": str(self.cpus), "group": self.group,
                             "members": {k: m.to_dict() for k, m in sorted(self.members.items())}}
        if self.parts:
            d["parts"] = [p.to_dict() for p in self.parts]
        return d

    @property
    def name(self) -> str:
        return f"{self.type.name}[{self.index}]"

    @property
    def milli(self) -> int:
        return sum(m.milli for m in self.members.values())


Saved = tuple[list[Balloon], list[tuple[Balloon, CPUSet, dict[str, Member], list[Balloon]]], set[str]]


def shares(size: int, parts: int) -> list[int]:
    """Each part of a composite balloon of size CPUs: the same share, rounded up, as nri-plugins
    balances them (10 CPUs over 4 nodes: 3 on each)."""
    return [-(-size // parts)] * parts


def hint(container: Container, pod: Pod, name: str) -> str | None:
    """A hint in our annotation domain, else in nri-plugins' (`<name>.resource-policy.nri.io`)."""
    found = annotations.hint(container, pod, name)
    return None if found is None else str(found[1])
