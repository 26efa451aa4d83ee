"""The balloons policy's configuration: policy options and balloon types.

Keys are read in any letter case, so cri-resmgr's (`BalloonTypes`, `MinCPUs`) and
nri-plugins' (`balloonTypes`, `minCPUs`) spellings both work.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from resmgr.policies.base import PolicyError
from resmgr.policies.toolkit import scheduling
from resmgr.policies.toolkit.expressions import Expression, parse_expression
from resmgr.policies.toolkit.options import Option, read, reserved_namespaces
from resmgr.topology.model import CoreKind, MemoryType

RESERVED, DEFAULT = "reserved", "default"
PRIORITIES = {"high": 0, "normal": 1, "low": 2, "none": 3}
SCOPES = ("system", "package", "die", "numa", "l2cache", "core")


def _priority(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3:
        return value
    if isinstance(value, str) and value.strip().lower() in PRIORITIES:
        return PRIORITIES[value.strip().lower()]
    raise PolicyError(f"{where}: {value!r} is not 0-3 or high, normal, low, none")


def _not_negative(value: int, where: str) -> int:
    if value < 0:
        raise PolicyError(f"{where}: must not be negative, got {value}")
    return value


def _memory_types(value: list[str], where: str) -> frozenset[MemoryType]:
    try:
        return frozenset(MemoryType(v.strip().lower()) for v in value)
    except ValueError:
        raise PolicyError(f"{where}: {value!r}: memory types are dram, pmem and hbm") from None


_NODE = re.compile(r"/sys/devices/system/node/node(\d+)")


def _component(doc: Mapping[str, Any], where: str) -> str:
    name = read(doc, (Option("BalloonType", "string", ""),), where)["BalloonType"]
    if not name:
        raise PolicyError(f"{where}: balloonType is required")
    return name


def _check_components(types: list[BalloonType]) -> None:
    """Every component names a type, and no type is a part of itself."""
    by_name = {t.name: t for t in types}

    def walk(t: BalloonType, path: tuple[str, ...]) -> None:
        for c in t.components:
            if c not in by_name:
                raise PolicyError(f"policy.balloons: type {t.name} has component {c!r}, which is not a balloon type")
            if c in path:
                raise PolicyError(f"policy.balloons: type {c} is a component of itself ({' > '.join(path + (c,))})")
            walk(by_name[c], path + (c,))

    for t in types:
        walk(t, (t.name,))


LOAD_OPTIONS = (
    Option("Name", "string", ""),
    Option("Level", "string", "core", choices=("core", "l2cache")),
    Option("OverloadsLevelInBalloon", "boolean", False, "also one CPU per core / L2 cache within the balloon"),
)

TYPE_OPTIONS = (
    Option("Name", "string", "", "the type's name, used by the balloon annotation"),
    Option("Namespaces", "strings", [], "namespaces (globs) whose containers go to this type"),
    Option("MatchExpressions", "objects", [], "container match expressions that pick this type"),
    Option("GroupBy", "string", "", "containers whose expansion of this text (${pod/labels/x} ...) "
           "differs go to different balloons"),
    Option("MinCPUs", "integer", 0, "CPUs a balloon always has", check=_not_negative),
    Option("MaxCPUs", "integer", 0, "CPUs a balloon may grow to (0: no limit)", check=_not_negative),
    Option("MinBalloons", "integer", 0, "balloons made at start and kept", check=_not_negative),
    Option("MaxBalloons", "integer", 0, "balloons of the type at most (0: no limit)", check=_not_negative),
    Option("AllocatorPriority", "any", None, "0 high (performance cores first), 1 normal, 2 low (efficient "
           "cores first), 3 none; types with min balloons get CPUs in this order (unset: high, and the core "
           "kind follows the container: performance for Guaranteed ones)", check=_priority),
    Option("CPUClass", "string", "", "the CPU class (cpu.Classes) of its balloons' CPUs"),
    Option("PreferNewBalloons", "boolean", False, "a new balloon for each container while CPUs last"),
    Option("PreferSpreadingPods", "boolean", False, "containers of one pod in different balloons"),
    Option("PreferPerNamespaceBalloon", "boolean", False, "one namespace's containers in the same balloons"),
    Option("PreferSpreadOnPhysicalCores", "any", None, "one thread per core first (default: the policy's)"),
    Option("ShareIdleCPUsInSame", "string", "", "containers also run on CPUs in no balloon within this scope: "
           + ", ".join(SCOPES), choices=("",) + SCOPES),
    Option("PreferCoreType", "string", "", "performance or efficient cores", choices=("", "performance", "efficient")),
    Option("PinMemory", "any", None, "pin memory to the balloon's NUMA nodes (default: the policy's)"),
    Option("MemoryTypes", "strings", [], "memory types to pin to: dram, pmem, hbm", check=_memory_types),
    Option("HideHyperthreads", "boolean", False, "containers run on one thread of each core"),
    Option("PreferIsolCpus", "boolean", False, "kernel-isolated CPUs first"),
    Option("PreferCloseToDevices", "strings", [], "devices to be near: NUMA nodes (/sys/devices/system/node/nodeN) "
           "are used, other devices accepted"),
    Option("ShowContainersInNrt", "boolean", False, "accepted, no effect"),
    Option("AllocatorTopologyBalancing", "any", None, "new balloons of this type where most CPUs are free "
           "(default: the policy's)"),
    Option("SchedulingClass", "string", "", "scheduling class of its containers (an annotation wins)"),
    Option("IrqClaim", "strings", [], "interrupts (globs over their /proc/interrupts description) handled "
           "by this type's balloons' CPUs"),
    Option("IrqMode", "string", "", "sink: interrupts nobody claims go to its balloons' CPUs; isolate: they are "
           "kept off them", choices=("", "sink", "isolate")),
    Option("RdtClass", "string", "", "RDT class of its containers (an annotation wins)"),
    Option("BlockioClass", "string", "", "block-I/O class of its containers (an annotation wins)"),
    Option("Loads", "strings", [], "load classes (LoadClasses) its containers put on cores or L2 caches"),
    Option("Components", "objects", [], "a composite balloon: its CPUs are those of a hidden balloon of each "
           "listed type, sized evenly", items=(Option("BalloonType", "string", ""),)),
    Option("DRA", "object", None, "{deviceName}: publish its balloons as DRA devices (docs/dra.md); only "
           "containers using a claim on one of them run there. Needs MinBalloons or MaxBalloons (claims make "
           "balloons up to it) and MaxCPUs (the published capacity); no Namespaces, MatchExpressions or Components"),
    Option("ComponentCreation", "string", "all", "which component balloons a composite balloon is made of: all "
           "(one of each type), or balance-balloons (one, of the first type in fewest balloons)",
           choices=("", "all", "balance-balloons")),
)

POLICY_OPTIONS = (
    Option("PinCPU", "boolean", True, "pin containers to their balloon's CPUs"),
    Option("PinMemory", "boolean", True, "pin containers to the memory nodes of their balloon's CPUs"),
    Option("IdleCPUClass", "string", "", "the CPU class (cpu.Classes) of CPUs in no balloon"),
    Option("ReservedPoolNamespaces", "strings", [], "namespaces (globs) on the reserved balloon; kube-system "
           "always is"),
    Option("AllocatorTopologyBalancing", "boolean", False, "new balloons where most CPUs are free instead of "
           "packing them"),
    Option("PreferSpreadOnPhysicalCores", "boolean", False, "one thread per core first, for every type"),
    Option("BalloonTypes", "objects", [], "the balloon types, in order of preference", items=TYPE_OPTIONS),
    Option("ControllableInterrupts", "strings", [], "the interrupts (globs) balloon types may claim, sink or "
           "isolate (none: every one)"),
    Option("SchedulingClasses", "objects", [], "scheduling classes (Linux scheduling policy, priority, nice, "
           "I/O priority) balloon types and annotations name", items=scheduling.OPTIONS),
    Option("Preserve", "object", None, "{matchExpressions: [...]}: containers the policy leaves alone"),
    Option("ShowContainersInNrt", "boolean", False, "accepted, no effect"),
    Option("LoadClasses", "objects", [], "{name, level: core | l2cache, overloadsLevelInBalloon}: CPUs for "
           "balloons with a load avoid cores / L2 caches other such balloons load", items=LOAD_OPTIONS),
    Option("AvailableResources", "object", None, "as policy.AvailableResources (the nri-plugins layout)"),
    Option("ReservedResources", "object", None, "as policy.ReservedResources (the nri-plugins layout)"),
)


@dataclass(frozen=True)
class Load:
    """Load a balloon's containers put on a level: other loading balloons keep off its cores / L2s."""
    name: str
    level: str  # core or l2cache
    in_balloon: bool = False  # also spread the balloon's own CPUs over that level


@dataclass(frozen=True)
class BalloonType:
    name: str
    namespaces: tuple[str, ...] = ()
    match: tuple[Expression, ...] = ()
    group_by: str = ""
    min_cpus: int = 0
    max_cpus: int = 0
    min_balloons: int = 0
    max_balloons: int = 0
    priority: int | None = None  # None: not configured
    cpu_class: str = ""
    prefer_new: bool = False
    spread_pods: bool = False
    per_namespace: bool = False
    spread_cores: bool = False
    share_idle: str = ""
    core_kind: CoreKind = CoreKind.UNKNOWN
    pin_memory: bool = True
    memory_types: frozenset[MemoryType] = frozenset()
    hide_ht: bool = False
    isolated: bool = False
    classes: dict[str, str] = field(default_factory=dict)  # by controller name
    loads: tuple[Load, ...] = ()
    near_nodes: tuple[int, ...] = ()  # PreferCloseToDevices naming NUMA nodes, first preferred first
    balance: bool = False  # new balloons where most CPUs are free (AllocatorTopologyBalancing)
    components: tuple[str, ...] = ()  # a composite type: the types of its parts
    balance_components: bool = False  # a part of one type only, the first in fewest balloons
    grows: bool = False  # the reserved type sets MinCPUs or MaxCPUs: it may grow past the reserved CPUs
    on_reserved: bool = False  # the built-in default type: runs on the reserved CPUs, owns none
    order: int = 0  # position in the configuration
    dra: str = ""  # published as DRA devices: the devices' name prefix ("": not published)
    irq_claim: tuple[str, ...] = ()  # interrupts (globs) its balloons' CPUs handle
    irq_mode: str = ""  # sink or isolate: what its CPUs are to interrupts nobody claims


@dataclass
class Settings:
    pin_cpu: bool = True
    pin_memory: bool = True
    reserved_namespaces: tuple[str, ...] = ("kube-system",)
    balance: bool = False
    types: list[BalloonType] = field(default_factory=list)
    preserve: tuple[Expression, ...] = ()
    idle_class: str = ""
    scheduling: scheduling.Scheduling = scheduling.NONE
    controllable_irqs: tuple[str, ...] = ()


def _bool_or(value: Any, default: bool, where: str) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise PolicyError(f"{where}: expected true or false, got {value!r}")
    return value


def _dra(doc: Any, t: Mapping[str, Any], name: str, where: str) -> str:
    """The device name prefix of a type published as DRA devices ("": not published)."""
    if doc is None:
        return ""
    prefix = read(doc, (Option("DeviceName", "string", ""),), where)["DeviceName"] or name
    prefix = re.sub(r"[^a-z0-9-]+", "-", prefix.lower()).strip("-")
    if not prefix or len(prefix) > 50:
        raise PolicyError(f"{where}.DeviceName: {prefix!r} does not make DNS labels of devices (a-z, 0-9 and -, "
                          "50 characters at most)")
    if name in (RESERVED, DEFAULT):
        raise PolicyError(f"{where}: the {name} balloon type cannot be published as DRA devices")
    wrong = [k for k in ("Namespaces", "MatchExpressions", "Components") if t[k]]
    if wrong:
        raise PolicyError(f"{where}: its containers come only from claims, so it cannot have {wrong[0]}")
    if not (t["MinBalloons"] or t["MaxBalloons"]) or not t["MaxCPUs"]:
        raise PolicyError(f"{where}: needs MinBalloons or MaxBalloons (the devices published: the balloons kept, "
                          "and those claims may make) and MaxCPUs (their capacity)")
    return prefix


def parse(section: Mapping[str, Any] | None) -> tuple[Settings, dict[str, Any]]:
    """The settings, and the raw policy-level values (for the nri-plugins resource layout)."""
    where = "policy.balloons"
    raw = read(section, POLICY_OPTIONS, where)
    s = Settings(pin_cpu=raw["PinCPU"], pin_memory=raw["PinMemory"], balance=raw["AllocatorTopologyBalancing"],
                 idle_class=raw["IdleCPUClass"])
    s.reserved_namespaces = tuple(reserved_namespaces(raw["ReservedPoolNamespaces"]))
    s.scheduling = scheduling.Scheduling.read(raw["SchedulingClasses"], None, None, where)
    s.controllable_irqs = tuple(raw["ControllableInterrupts"])
    preserve = read(raw["Preserve"], (Option("MatchExpressions", "objects", []),), f"{where}.Preserve")
    s.preserve = tuple(parse_expression(e, f"{where}.Preserve.MatchExpressions[{i}]")
                       for i, e in enumerate(preserve["MatchExpressions"]))
    loads: dict[str, Load] = {}
    for i, doc in enumerate(raw["LoadClasses"]):
        lc = read(doc, LOAD_OPTIONS, f"{where}.LoadClasses[{i}]")
        if not lc["Name"] or lc["Name"] in loads:
            raise PolicyError(f"{where}.LoadClasses[{i}]: a Name of its own is required")
        loads[lc["Name"]] = Load(lc["Name"], lc["Level"], lc["OverloadsLevelInBalloon"])
    seen: set[str] = set()
    for i, doc in enumerate(raw["BalloonTypes"]):
        t = read(doc, TYPE_OPTIONS, f"{where}.BalloonTypes[{i}]")
        name = t["Name"]
        at = f"{where}.BalloonTypes[{i}] ({name or 'no name'})"
        if not name:
            raise PolicyError(f"{where}.BalloonTypes[{i}]: Name is required")
        if name in seen:
            raise PolicyError(f"{at}: a second type of that name")
        seen.add(name)
        if t["MaxCPUs"] and t["MinCPUs"] > t["MaxCPUs"]:
            raise PolicyError(f"{at}: MinCPUs {t['MinCPUs']} is more than MaxCPUs {t['MaxCPUs']}")
        missing = [n for n in t["Loads"] if n not in loads]
        if missing:
            raise PolicyError(f"{at}.Loads: {missing[0]!r} is not in LoadClasses ({', '.join(loads) or 'none'})")
        if t["MaxBalloons"] and t["MinBalloons"] > t["MaxBalloons"]:
            raise PolicyError(f"{at}: MinBalloons {t['MinBalloons']} is more than MaxBalloons {t['MaxBalloons']}")
        dra = _dra(t["DRA"], t, name, f"{at}.DRA")
        classes = {"rdt": t["RdtClass"], "blockio": t["BlockioClass"],
                   "sched": scheduling.named(s.scheduling.classes, t["SchedulingClass"], f"{at}.SchedulingClass")}
        s.types.append(BalloonType(
            name=name, namespaces=tuple(t["Namespaces"]),
            match=tuple(parse_expression(e, f"{at}.MatchExpressions[{j}]")
                        for j, e in enumerate(t["MatchExpressions"])),
            group_by=t["GroupBy"], min_cpus=t["MinCPUs"], max_cpus=t["MaxCPUs"], min_balloons=t["MinBalloons"],
            max_balloons=t["MaxBalloons"], priority=t["AllocatorPriority"], cpu_class=t["CPUClass"],
            prefer_new=t["PreferNewBalloons"], spread_pods=t["PreferSpreadingPods"],
            per_namespace=t["PreferPerNamespaceBalloon"],
            spread_cores=_bool_or(t["PreferSpreadOnPhysicalCores"], raw["PreferSpreadOnPhysicalCores"],
                                  f"{at}.PreferSpreadOnPhysicalCores"),
            share_idle=t["ShareIdleCPUsInSame"], core_kind=CoreKind(t["PreferCoreType"]),
            balance=_bool_or(t["AllocatorTopologyBalancing"], raw["AllocatorTopologyBalancing"],
                             f"{at}.AllocatorTopologyBalancing"),
            pin_memory=_bool_or(t["PinMemory"], raw["PinMemory"], f"{at}.PinMemory"),
            memory_types=t["MemoryTypes"] or frozenset(), hide_ht=t["HideHyperthreads"],
            isolated=t["PreferIsolCpus"], classes=classes, order=i,
            loads=tuple(loads[n] for n in t["Loads"]),
            near_nodes=tuple(int(m.group(1)) for d in t["PreferCloseToDevices"]
                             for m in [_NODE.fullmatch(d.rstrip("/"))] if m),
            components=tuple(_component(c, f"{at}.Components[{j}]") for j, c in enumerate(t["Components"])),
            balance_components=t["ComponentCreation"] == "balance-balloons",
            grows=name == RESERVED and bool(t["MinCPUs"] or t["MaxCPUs"]), dra=dra,
            irq_claim=tuple(t["IrqClaim"]), irq_mode=t["IrqMode"].lower(),
            # The reserved balloon is the reserved CPUs; so is the default one without MinCPUs or
            # MaxCPUs of its own (cri-resmgr's rule) unless it groups its containers: its groups need
            # balloons of their own.
            on_reserved=name == RESERVED or (name == DEFAULT and not t["MinCPUs"] and not t["MaxCPUs"]
                                             and not t["GroupBy"])))
    _check_components(s.types)
    if RESERVED not in seen:
        s.types.insert(0, BalloonType(RESERVED, on_reserved=True, pin_memory=raw["PinMemory"], order=-1,
                                      balance=raw["AllocatorTopologyBalancing"]))
    if DEFAULT not in seen:
        s.types.append(BalloonType(DEFAULT, on_reserved=True, pin_memory=raw["PinMemory"], order=len(s.types),
                                   balance=raw["AllocatorTopologyBalancing"]))
    return s, raw
