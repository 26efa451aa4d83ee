"""What the balloons give the node's controls (CPU classes, interrupts) and how `cri-resmgr
status` shows them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resmgr.model import IrqPlan
from resmgr.policies.balloons.fleet import Fleet
from resmgr.policies.balloons.model import Balloon, Member
from resmgr.policies.balloons.types import RESERVED
from resmgr.policies.toolkit.describe import pool_entry
from resmgr.topology.cpuset import EMPTY, CPUSet, union
from resmgr.topology.model import Topology


def cpu_classes(fleet: Fleet, reserved: CPUSet, allocatable: CPUSet, idle: str) -> dict[str, CPUSet]:
    """Each balloon's CPUs in its type's CPUClass; the CPUs in no balloon in the idle class."""
    out: dict[str, CPUSet] = {}
    for b in fleet.balloons:
        name = b.type.cpu_class
        if name:
            cpus = reserved | b.cpus if b.type.on_reserved else union(x.cpus for x in b.leaves)
            out[name] = out.get(name, EMPTY) | cpus
    if idle:
        out[idle] = out.get(idle, EMPTY) | (allocatable - fleet.owned())
    return out


def irq_plan(fleet: Fleet, controllable: tuple[str, ...]) -> IrqPlan:
    """Claimed interrupts on their types' balloons' CPUs; the others on the sink balloons' CPUs,
    or off the isolating ones."""
    claims: dict[tuple[str, ...], CPUSet] = {}
    sink, isolate = EMPTY, EMPTY
    for b in fleet.balloons:
        t = b.type
        cpus = union(x.cpus for x in b.leaves)
        if t.irq_claim:
            claims[t.irq_claim] = claims.get(t.irq_claim, EMPTY) | cpus
        if t.irq_mode == "sink":
            sink |= cpus
        elif t.irq_mode == "isolate":
            isolate |= cpus
    return IrqPlan(tuple(sorted(claims.items())), sink=sink, isolate=isolate, controllable=controllable)


def describe_pools(topology: Topology, fleet: Fleet, reserved: CPUSet, isolated: CPUSet) -> list[dict[str, Any]]:
    out = []
    for b in sorted(fleet.balloons, key=lambda b: (b.type.order, b.index)):
        cpus = reserved | b.cpus if b.type.on_reserved else b.cpus
        runs = fleet.runs_on(b, Member(0, "", ""))
        out.append(pool_entry(topology, b.name, cpus, runs, reserved=cpus & reserved,
                              isolated=cpus & isolated, containers=len(b.members), requested=b.milli,
                              free=1000 * len(cpus) - b.milli,
                              elsewhere=len(b.members) if not b.cpus and not b.type.on_reserved else 0,
                              type=b.type.name, cpu_class=b.type.cpu_class))
    return out


def describe_grant(b: Balloon, key: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"pool": b.name, "exclusive": "", "shared_milli": b.members[key].milli,
                           "kind": "reserved" if b.type.name == RESERVED else "shared"}
    if b.members[key].wanted:
        doc["fallback"] = "reserved"
    return doc


def fallback(fleet: Fleet, orphans: Mapping[str, str], reserved: CPUSet) -> list[str]:
    """What runs otherwise than configured, and why (orphans: containers annotated for a type no
    longer configured, by key, with the type)."""
    wanted = sorted({m.wanted for b in fleet.balloons for m in b.members.values() if m.wanted})
    out = [f"no balloon of type {t} could be had: its containers asking for no CPU time run on the reserved "
           f"CPUs {reserved}" for t in wanted]
    for t in sorted(set(orphans.values())):
        count = sum(1 for x in orphans.values() if x == t)
        out.append(f"balloon type {t} is no longer configured: {count} container(s) annotated for it run where "
                   "their namespace puts them")
    for b in fleet.balloons:
        cpus = reserved | b.cpus
        if b.type.name == RESERVED and b.milli > 1000 * len(cpus):
            why = "no MinCPUs or MaxCPUs of a reserved type" if not b.type.grows else \
                f"MaxCPUs {b.type.max_cpus}" if b.type.max_cpus and len(cpus) >= b.type.max_cpus else "no free CPUs"
            out.append(f"balloon {b.name}: its containers request {b.milli}m on {len(cpus)} CPUs {cpus} "
                       f"({why} to grow by)")
    return out
