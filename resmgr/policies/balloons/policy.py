"""The `balloons` policy: containers in balloons, disjoint sets of CPUs that grow and shrink.

Every container goes to one balloon and runs on its CPUs (and, with ShareIdleCPUsInSame, on
the CPUs in no balloon near them). Its balloon type comes from the pod's `balloon.balloons`
annotation, else the reserved namespaces (kube-system always) go to the reserved balloon,
else the first type whose Namespaces or MatchExpressions match, else `default`. Within the
type (and its GroupBy group) it joins an existing balloon or a new one, ranked by: the pod
and namespace preferences; then an empty balloon, a balloon that holds it as it is, one
that grows, a new one (PreferNewBalloons: empty, new, then the rest); most CPU time left;
lowest index. A balloon holds max(MinCPUs, its containers' requests rounded up) CPUs, one
at least while it has containers, never more than MaxCPUs; it grows with CPUs nearest its
own and shrinks to its most compact part. Types with MinBalloons get their balloons at
start, highest AllocatorPriority first. The reserved balloon is the reserved CPUs, and so is
the default balloon unless its type sets MinCPUs or MaxCPUs. A container that asks for no
CPU time is never refused: when no balloon of its type can be had it runs on the reserved
CPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from resmgr.model import Claim, Container, ContainerState, Pod, QOSClass, Resources
from resmgr.policies.balloons.types import DEFAULT, POLICY_OPTIONS, RESERVED, BalloonType, parse
from resmgr.policies.base import Decision, Policy, PolicyError, View, container_requirements
from resmgr.policies.toolkit import annotations, claims, cpuvalues
from resmgr.policies.toolkit.allocator import Preferences, one_thread_per_core, take_cpus
from resmgr.policies.toolkit.describe import pool_entry
from resmgr.policies.toolkit.expressions import substitute
from resmgr.policies.toolkit.options import in_namespaces
from resmgr.policies.toolkit.undo import undone_on_failure
from resmgr.requests import CLASS_ANNOTATIONS, class_names, effective_annotation, milli_to_shares
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import CoreKind, MemoryType, Topology

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


_Saved = tuple[list[Balloon], list[tuple[Balloon, CPUSet, dict[str, Member], list[Balloon]]], set[str]]


def _shares(size: int, parts: int) -> list[int]:
    """Each part of a composite balloon of size CPUs: the same share, rounded up, as nri-plugins
    balances them (10 CPUs over 4 nodes: 3 on each)."""
    return [-(-size // parts)] * parts


def _union(sets: Iterable[CPUSet]) -> CPUSet:
    out = EMPTY
    for cpus in sets:
        out |= cpus
    return out


def _hint(container: Container, pod: Pod, name: str) -> str | None:
    """A hint in our annotation domain, else in nri-plugins' (`<name>.resource-policy.nri.io`)."""
    found = annotations.hint(container, pod, name)
    return None if found is None else str(found[1])


class BalloonsPolicy(claims.ClaimHolder, Policy):
    name = "balloons"
    description = ("containers in typed balloons, CPU pools that grow and shrink with their requests, "
                   "matched by annotation, namespace or expressions")
    options = POLICY_OPTIONS

    def __init__(self, config: Mapping[str, Any] | None = None, topology: Topology | None = None) -> None:
        super().__init__(config, topology)
        self.topo = self.require_topology()
        self.settings, raw = parse(self.config.get(self.name))
        resources = dict(self.config)
        for key in ("AvailableResources", "ReservedResources"):
            if resources.get(key) is None and raw[key] is not None:
                resources[key] = raw[key]
        cpus = cpuvalues.resolve_cpus(resources, topology)
        self.isolated = cpus.isolated
        self.reserved = cpus.reserved or take_cpus(topology, cpus.general, 1)
        self.allocatable = cpus.available - self.reserved
        self.types = {t.name: t for t in self.settings.types}
        self.balloons: list[Balloon] = [Balloon(t, 0) for t in self.settings.types if t.on_reserved]
        self.where: dict[str, Balloon] = {}
        self.preserved: set[str] = set()
        self.orphans: dict[str, str] = {}  # running containers annotated for a type the configuration dropped
        # DRA: claims prepared on balloons of DRA types (each a member of its balloon, keyed claims.key), and
        # those unprepared while containers still run on them.
        self.claims: dict[str, Claim] = {}
        self.unprepared: set[str] = set()
        self._make_min_balloons()

    # -- CPUs -----------------------------------------------------------------------------
    def owned(self) -> CPUSet:
        out = EMPTY
        for b in self.balloons:
            for leaf in b.leaves:
                out |= leaf.cpus
        return out

    def free(self, t: BalloonType | None = None) -> CPUSet:
        """CPUs in no balloon that a balloon of type t may take (isolated ones only if it prefers them)."""
        free = self.allocatable - self.owned()
        return free if t is not None and t.isolated else free - self.isolated

    def _prefer(self, t: BalloonType, guaranteed: bool = False) -> Preferences:
        """How a balloon of type t chooses CPUs: PreferCoreType, else AllocatorPriority where set (high:
        performance cores, low: efficient ones), else performance cores for a Guaranteed container."""
        kind = t.core_kind
        if not kind and self.topo.hybrid:
            if t.priority is not None:
                kind = {0: CoreKind.PERFORMANCE, 2: CoreKind.EFFICIENT}.get(t.priority, CoreKind.UNKNOWN)
            elif guaranteed:
                kind = CoreKind.PERFORMANCE
        return Preferences(kind=kind, spread_cores=t.spread_cores, balance=t.balance)

    def _take(self, t: BalloonType, count: int, near: CPUSet = EMPTY, guaranteed: bool = False,
              owner: Balloon | None = None) -> CPUSet:
        """count free CPUs for a balloon of type t: off the cores / L2 caches other balloons load
        when it has loads (while enough are free), then as _take_from says."""
        free = self.free(t)
        unloaded = free - self._loaded(t, owner)
        if t.loads and unloaded != free and len(unloaded) >= count:
            return self._take_from(t, unloaded, count, near, guaranteed)
        return self._take_from(t, free, count, near, guaranteed)

    def _groups(self, level: str) -> list[CPUSet]:
        return list(self.topo.cores.values()) if level == "core" else list(set(self.topo.l2_of.values()))

    def _loaded(self, t: BalloonType, owner: Balloon | None) -> CPUSet:
        """CPUs on the cores / L2 caches that other balloons loading the same level hold (and, with
        OverloadsLevelInBalloon, that its own balloon holds)."""
        out = EMPTY
        for load in t.loads:
            holders = EMPTY
            for b in self.balloons:
                if (b is not owner or load.in_balloon) and any(x.level == load.level for x in b.type.loads):
                    holders |= b.cpus
            for g in self._groups(load.level):
                if g & holders:
                    out |= g
        return out

    def _take_from(self, t: BalloonType, free: CPUSet, count: int, near: CPUSet, guaranteed: bool) -> CPUSet:
        """count of free for a balloon of type t: isolated ones first if it prefers them, else the
        nearest to near (its own CPUs) that hold them, else the best anywhere."""
        prefer = self._prefer(t, guaranteed)
        # Another type's PreferCloseToDevices keeps this one away from those devices' nodes while
        # there is room elsewhere (nri-plugins' implied anti-affinity).
        away = _union(self.topo.node_cpus(n) for o in self.settings.types if o is not t
                      for n in o.near_nodes if n not in t.near_nodes)
        if away and len(free - away) >= count:
            free = free - away
        near_nodes = CPUSet()
        for n in t.near_nodes:  # PreferCloseToDevices: the first device's node that holds it
            if len(free & self.topo.node_cpus(n)) >= count:
                near_nodes = free & self.topo.node_cpus(n)
                break
        if near_nodes:
            free = near_nodes
        if any(load.in_balloon and load.level == "core" for load in t.loads):
            prefer = replace(prefer, spread_cores=True)
        if any(load.in_balloon and load.level == "l2cache" for load in t.loads):
            one_each = CPUSet(min(g & free) for g in self._groups("l2cache") if g & free and not g & near)
            if len(one_each) >= count:
                free = one_each
        if t.isolated:
            iso = free & self.isolated
            if len(iso) >= count:
                return take_cpus(self.topo, iso, count, prefer)
            return iso | take_cpus(self.topo, free - iso, count - len(iso), prefer)
        if near:
            for level in reversed(self.topo.hierarchy):
                if level.name == "core" and prefer.spread_cores:
                    continue
                region = EMPTY
                for g in level.groups:
                    if g & near:
                        region |= g
                if len(free & region) >= count:
                    return take_cpus(self.topo, free & region, count, prefer)
        return take_cpus(self.topo, free, count, prefer)

    def _size(self, t: BalloonType, milli: int, members: bool) -> int | None:
        """The CPUs a balloon of type t holds for milli requested (None: more than MaxCPUs)."""
        need = -(-milli // 1000)
        if t.max_cpus and need > t.max_cpus:
            return None
        return max(need, t.min_cpus, 1 if members else 0)

    def _resize(self, b: Balloon, size: int, guaranteed: bool = False) -> None:
        """Grow (for a Guaranteed container: performance cores on a hybrid part) or shrink b; a
        composite's parts share the size evenly."""
        if b.type.on_reserved:
            if b.type.name == RESERVED:
                self._fit_reserved(b)
            return
        if size == len(b.cpus):
            return
        if b.parts:
            for part, share in zip(b.parts, _shares(size, len(b.parts)), strict=True):
                self._resize(part, max(share, part.type.min_cpus), guaranteed)
                b.cpus = _union(p.cpus for p in b.parts)
            return
        if size > len(b.cpus):
            b.cpus |= self._take(b.type, size - len(b.cpus), b.cpus, guaranteed, owner=b)
        else:  # keep its most compact part
            b.cpus = take_cpus(self.topo, b.cpus, size, self._prefer(b.type))

    def _fit_reserved(self, b: Balloon) -> None:
        """The reserved balloon is the reserved CPUs. As nri-plugins has it, when a `reserved` type
        sets MinCPUs or MaxCPUs it grows past them with free CPUs near them while its containers
        request more (up to MaxCPUs), and gives them back as they go. What it cannot get is
        overcommitted, with a notice (fallback)."""
        if not b.type.grows:
            return
        want = -(-b.milli // 1000) - len(self.reserved)
        if b.type.max_cpus:
            want = min(want, b.type.max_cpus - len(self.reserved))
        want = max(want, 0)
        if want > len(b.cpus):
            more = min(want - len(b.cpus), len(self.free(b.type)))
            if more:
                b.cpus |= self._take(b.type, more, self.reserved | b.cpus)
        elif want < len(b.cpus):
            b.cpus = take_cpus(self.topo, b.cpus, want, self._prefer(b.type)) if want else EMPTY

    def _new_balloon(self, t: BalloonType, size: int, group: str = "", guaranteed: bool = False,
                     previous: CPUSet = EMPTY) -> Balloon:
        used = {b.index for b in self.balloons if b.type is t}
        index = next(i for i in range(len(used) + 1) if i not in used)
        b = Balloon(t, index, group=group)
        self.balloons.append(b)
        self._fill(b, size, guaranteed, previous)
        return b

    def _fill(self, b: Balloon, size: int, guaranteed: bool, previous: CPUSet = EMPTY) -> None:
        """Give a new balloon its CPUs: those its first member ran on before when they are free, else
        a composite's parts (hidden balloons of the component types) one after the other, each its
        even share by its own type's preferences."""
        if not b.type.components:
            again = previous & self.free(b.type)
            if len(again) >= size:
                b.cpus = take_cpus(self.topo, again, size, self._prefer(b.type, guaranteed))
            else:
                b.cpus = self._take(b.type, size, guaranteed=guaranteed)
            return
        names = b.type.components
        if b.type.balance_components:  # one part, of the first component type in fewest balloons
            names = (min(names, key=lambda n: (self._in_use(self.types[n]), names.index(n))),)
        for name, share in zip(names, _shares(size, len(names)), strict=True):
            t = self.types[name]
            part = Balloon(t, len(b.parts))
            b.parts.append(part)
            self._fill(part, max(share, t.min_cpus), guaranteed)
            b.cpus = _union(p.cpus for p in b.parts)

    def _in_use(self, t: BalloonType) -> int:
        """Balloons of type t, composites' parts at any depth included; for a composite type, those of
        its component types (nri-plugins' measure for balance-balloons)."""
        if t.components:
            return sum(self._in_use(self.types[c]) for c in t.components)

        def count(b: Balloon) -> int:
            return (b.type is t) + sum(count(p) for p in b.parts)

        return sum(count(b) for b in self.balloons)

    def _make_min_balloons(self) -> None:
        for t in sorted(self.settings.types, key=lambda t: (t.priority or 0, t.order)):
            if t.on_reserved:
                continue
            while sum(1 for b in self.balloons if b.type is t) < t.min_balloons:
                if len(self.free(t)) < t.min_cpus:
                    raise PolicyError(f"balloon type {t.name}: no room for {t.min_balloons} balloons of "
                                      f"{t.min_cpus} CPUs ({len(self.free(t))} CPUs free: {self.free(t) or 'none'})")
                self._new_balloon(t, t.min_cpus)

    # -- where a container runs ---------------------------------------------------------------
    def _runs_on(self, b: Balloon, m: Member) -> CPUSet:
        base = self.reserved | b.cpus if b.type.on_reserved or not b.cpus else b.cpus
        scope = b.type.share_idle
        if scope and b.cpus:
            idle = self.free()
            if scope == "system":
                base |= idle
            else:
                groups = {"package": self.topo.packages.values(), "die": self.topo.dies.values(),
                          "numa": [self.topo.node_cpus(n) for n in self.topo.nodes],
                          "l2cache": set(self.topo.l2_of.values()), "core": self.topo.cores.values()}[scope]
                for g in groups:
                    if g & b.cpus:
                        base |= g & idle
        return one_thread_per_core(self.topo, base) if m.hide_ht or b.type.hide_ht else base

    @staticmethod
    def _mem_types(b: Balloon, m: Member) -> frozenset[MemoryType]:
        """The container's memory-type annotation, else its type's MemoryTypes, else DRAM and PMEM."""
        return m.mem_types or b.type.memory_types or annotations.DEFAULT_MEMORY

    def _mems(self, cpus: CPUSet, types: frozenset[MemoryType]) -> CPUSet:
        """The memory nodes of the CPUs' NUMA nodes, of the given types (memory-only nodes by distance)."""
        nodes = {self.topo.cpus[c].node for c in cpus if c in self.topo.cpus and self.topo.cpus[c].node >= 0}
        out = set()
        cpu_nodes = [n for n in self.topo.nodes.values() if n.cpus]
        for n in self.topo.nodes.values():
            if not n.memory or n.kind not in types:
                continue
            if n.id in nodes:
                out.add(n.id)
            elif not n.cpus and cpu_nodes:
                nearest = min(cpu_nodes, key=lambda c: (n.distances.get(c.id, 1 << 16), c.id))
                if nearest.id in nodes:
                    out.add(n.id)
        return CPUSet(out) if out else CPUSet(nodes)

    def _resources(self, base: Resources, b: Balloon, m: Member) -> Resources:
        cpus = self._runs_on(b, m)
        out = base.with_cpus(str(cpus) if self.settings.pin_cpu and m.pin_cpu else base.cpuset_cpus)
        if m.claim:  # its own request, and its part of the claim's CPUs
            users = len(self._claim_users(m.claim))
            out.cpu_shares = milli_to_shares(m.milli + 1000 * self.claims[m.claim].cpus // max(users, 1)) \
                if m.claim in self.claims else milli_to_shares(m.milli)
        if b.type.pin_memory and m.pin_memory and self.topo.nodes:
            mems = self._mems(cpus, self._mem_types(b, m))
            if mems:
                out.cpuset_mems = str(mems)
        return out

    def _snapshot(self) -> dict[str, tuple[CPUSet, CPUSet]]:
        """Every member's CPUs and memory nodes (computed once per balloon and kind of member)."""
        out = {}
        for b in self.balloons:
            seen: dict[tuple[bool, frozenset[MemoryType]], tuple[CPUSet, CPUSet]] = {}
            for key, m in b.members.items():
                kind = (m.hide_ht, m.mem_types)
                if kind not in seen:
                    cpus = self._runs_on(b, m)
                    seen[kind] = cpus, self._mems(cpus, self._mem_types(b, m))
                out[key] = seen[kind]
        return out

    def _updates(self, before: Mapping[str, tuple[CPUSet, CPUSet]], view: View, skip: str) -> dict[str, Resources]:
        updates = {}
        for key, now in self._snapshot().items():
            c = view.containers.get(key)
            if key != skip and c is not None and before.get(key) != now:
                updates[key] = self._resources(c.resources, self.where[key], self.where[key].members[key])
        return updates

    # -- choosing a balloon ---------------------------------------------------------------------
    def _type_of(self, container: Container, pod: Pod) -> BalloonType:
        named = _hint(container, pod, BALLOON)
        self.orphans.pop(container.key, None)
        if named is not None:
            t = self.types.get(named.strip())
            if t is not None:
                return t
            if container.state in (ContainerState.PENDING, ContainerState.UNKNOWN):  # being created: a wrong name
                raise PolicyError(f"container {pod.namespace}/{pod.name}/{container.name}: balloon type {named!r} "
                                  f"does not exist (types: {', '.join(self.types)})")
            # A running one whose type a new configuration dropped: placed as if unannotated, and said so.
            self.orphans[container.key] = named.strip()
        if in_namespaces(pod.namespace, self.settings.reserved_namespaces):
            return self.types[RESERVED]
        for t in self.settings.types:
            if in_namespaces(pod.namespace, t.namespaces) or \
                    any(e(container, pod) for e in t.match):
                return t
        return self.types[DEFAULT]

    def _choose(self, t: BalloonType, group: str, m: Member, previous: CPUSet = EMPTY) -> tuple[Balloon | None, int]:
        """The balloon for a new member and the size it then has (None: a new balloon of that size);
        first one on the CPUs the member ran on before (a restart, a node reboot), if any."""
        if t.on_reserved:
            return next(b for b in self.balloons if b.type is t), 0
        free_cpus = self.free(t)
        free, again = len(free_cpus), len(previous & free_cpus)
        options: list[tuple[tuple[Any, ...], Balloon | None, int]] = []
        for b in self.balloons:
            if b.type is not t or b.group != group:
                continue
            size = self._size(t, b.milli + m.milli, True)
            if size is None or size - len(b.cpus) > free:
                continue
            pods = {x.pod for x in b.members.values()}
            namespaces = {x.namespace for x in b.members.values()}
            pod_rank = (2 if m.pod in pods else 1) if t.spread_pods else (0 if m.pod in pods else 1)
            ns_rank = (0 if namespaces == {m.namespace} else 1 if not namespaces else 2) if t.per_namespace else 0
            # As nri-plugins has it: spreading a pod (unless new balloons are preferred) makes no new
            # balloon while one holds the container as it is, and a group's balloon takes its group's
            # containers before a new one.
            holds = not t.spread_pods or t.prefer_new
            as_is = 0 if holds or size <= len(b.cpus) else 1
            if t.prefer_new and not group:
                kind = 0 if not b.members else 2
            else:
                kind = 0 if size <= len(b.cpus) else 1
            left = 1000 * max(size, len(b.cpus)) - b.milli - m.milli
            sticky = 0 if previous & b.cpus else 1
            options.append(((sticky, as_is, pod_rank, ns_rank, kind, -left, b.index), b, size))
        count = sum(1 for b in self.balloons if b.type is t)
        size = self._size(t, m.milli, True)
        if size is not None and (not t.max_balloons or count < t.max_balloons) and size <= free:
            sticky = 0 if previous and again >= size else 1
            options.append(((sticky, 1 if t.spread_pods and not t.prefer_new else 0, 1, 1 if t.per_namespace else 0,
                             1 if t.prefer_new and not group else 2, -(1000 * size - m.milli), 1 << 30), None, size))
        if not options:
            raise PolicyError(self._no_room(t, group, m))
        _, b, size = min(options, key=lambda o: o[0])
        return b, size

    def _no_room(self, t: BalloonType, group: str, m: Member) -> str:
        mine = [b for b in self.balloons if b.type is t]
        why = f"MaxCPUs {t.max_cpus}" if t.max_cpus and -(-m.milli // 1000) > t.max_cpus else \
            f"{len(mine)} of MaxBalloons {t.max_balloons}" if t.max_balloons and len(mine) >= t.max_balloons else \
            f"{len(self.free(t))} free CPUs"
        held = ", ".join(f"{b.name} {len(b.cpus)} CPUs {b.milli}m" for b in mine) or "none"
        return (f"balloon type {t.name}{f' group {group!r}' if group else ''}: no balloon can take "
                f"{m.milli}m more ({why}; balloons: {held})")

    # -- the policy interface ---------------------------------------------------------------------
    def _member(self, container: Container, pod: Pod) -> Member:
        req = container_requirements(container, pod)
        hide = bool(annotations.hide_hyperthreads(container, pod))
        return Member(req.cpu_request, pod.id, pod.namespace, hide,
                      pin_cpu=not self._preserve(container, pod, "cpu"),
                      pin_memory=not self._preserve(container, pod, "memory"),
                      mem_types=self._memory_types(container, pod))

    def _memory_types(self, container: Container, pod: Pod) -> frozenset[MemoryType]:
        """The memory-type annotation, ours or nri-plugins' (`memory-type.resource-policy.nri.io`)."""
        return annotations.memory_types(container, pod) or frozenset()

    def _preserve(self, container: Container, pod: Pod, what: str) -> bool:
        value = _hint(container, pod, f"{what}.preserve")
        return value is not None and annotations.to_bool(f"{what}.preserve", container.name, value)

    def _save(self) -> _Saved:
        """What undoing a failed change needs: the balloons, and each one's CPUs, members and parts."""
        nodes: list[tuple[Balloon, CPUSet, dict[str, Member], list[Balloon]]] = []

        def keep(b: Balloon) -> None:
            nodes.append((b, b.cpus, dict(b.members), list(b.parts)))
            for p in b.parts:
                keep(p)

        for b in self.balloons:
            keep(b)
        return list(self.balloons), nodes, set(self.preserved)

    def _load(self, saved: _Saved) -> None:
        self.balloons, nodes, self.preserved = list(saved[0]), saved[1], set(saved[2])
        for b, cpus, members, parts in nodes:
            b.cpus, b.members, b.parts = cpus, members, parts
        self.where = {k: b for b in self.balloons for k in b.members}

    def allocate(self, container: Container, pod: Pod, view: View) -> Decision:
        before = self._snapshot()
        with undone_on_failure(self._save, self._load):
            self._remove(container.key)
            if any(e(container, pod) for e in self.settings.preserve):
                self.preserved.add(container.key)
                return Decision(updates=self._updates(before, view, container.key))
            m = self._member(container, pod)
            if container.claims:
                return self._on_claim(container, pod, m, view, before)
            t = self._type_of(container, pod)
            if t.dra:
                raise PolicyError(f"container {pod.namespace}/{pod.name}/{container.name}: balloon type {t.name} is "
                                  "published as DRA devices; its balloons are had only through a resource claim")
            group = self._group(t, container, pod)
            previous = CPUSet.parse_or_empty(container.previous)
            try:
                b, size = self._choose(t, group, m, previous)
            except PolicyError:
                if m.milli:
                    raise
                # Nothing asked, nothing refused: the reserved CPUs.
                b, size, m = next(x for x in self.balloons if x.type.name == RESERVED), 0, replace(m, wanted=t.name)
        guaranteed = pod.qos_class == QOSClass.GUARANTEED
        if b is None:
            b = self._new_balloon(t, size, group, guaranteed, previous)
        else:
            self._resize(b, size, guaranteed)
        self._put(container.key, b, m)
        if b.type.name == RESERVED:
            self._fit_reserved(b)
        classes = self._classes(container, pod, b.type)
        resources = self._resources(container.requested, b, m)
        resources.cpu_shares = milli_to_shares(m.milli)
        return Decision(resources=resources, classes=classes,
                        updates=self._updates(before, view, container.key))

    def _on_claim(self, container: Container, pod: Pod, m: Member, view: View,
                  before: Mapping[str, tuple[CPUSet, CPUSet]]) -> Decision:
        """A container using claims: in the balloon they were prepared on, with its request counted."""
        who = f"container {pod.namespace}/{pod.name}/{container.name}"
        held = {u: self.claims[u] for u in container.claims if u in self.claims and u not in self.unprepared}
        missing = [u for u in container.claims if u not in held]
        if missing:
            raise PolicyError(f"{who} uses claim {missing[0]}, which is not prepared on this node")
        homes = {u: self.where[claims.key(u)] for u in held}
        if len({id(b) for b in homes.values()}) > 1:
            named = " and ".join(f"{held[u].who} on balloon {b.name}" for u, b in sorted(homes.items()))
            raise PolicyError(f"{who} uses {named}: a container runs in one balloon")
        uid = sorted(held)[0]
        b = homes[uid]
        named = _hint(container, pod, BALLOON)
        if named is not None and named.strip() != b.type.name:
            raise PolicyError(f"{who}: its balloon annotation names type {named.strip()}, but {held[uid].who} is on "
                              f"balloon {b.name} of type {b.type.name}")
        m = replace(m, claim=uid)
        size = self._size(b.type, b.milli + m.milli, True)
        if size is None or size - len(b.cpus) > len(self.free(b.type)):
            raise PolicyError(f"{who}: balloon {b.name} cannot grow by its {m.milli}m "
                              f"({self._no_room(b.type, b.group, m)})")
        self._resize(b, size, pod.qos_class == QOSClass.GUARANTEED)
        self._put(container.key, b, m)
        updates = self._updates(before, view, container.key)
        updates.update(self._sharers(uid, view, container.key))  # the others' part of the claim's CPU time
        return Decision(resources=self._resources(container.requested, b, m),
                        classes=self._classes(container, pod, b.type), updates=updates)

    # -- DRA claims (docs/dra.md) ------------------------------------------------------------
    def _claim_users(self, uid: str) -> list[str]:
        return sorted(k for k, b in self.where.items() if b.members[k].claim == uid)

    def _dra_balloons(self) -> dict[str, Balloon]:
        """The balloons published as DRA devices, by device name."""
        return {f"{b.type.dra}-{b.index}": b for b in self.balloons if b.type.dra}

    def devices(self) -> list[dict[str, Any]]:
        return [{"name": name, "attributes": {"kind": "balloon", "balloonType": b.type.name, "instance": b.index},
                 "cpus": b.type.max_cpus, "cpuset": str(b.cpus)} for name, b in sorted(self._dra_balloons().items())]

    def _hold(self, claim: Claim) -> int:
        b = self._dra_balloons().get(claim.device)
        if b is None:
            raise PolicyError(f"{claim.who}: this node has no device {claim.device} (it offers "
                              f"{', '.join(sorted(self._dra_balloons())) or 'none'})")
        count = claim.cpus or b.type.max_cpus
        size = self._size(b.type, b.milli + 1000 * count, True)
        if size is None or size - len(b.cpus) > len(self.free(b.type)):
            raise PolicyError(f"{claim.who}: balloon {b.name} cannot grow by {count} CPU(s) "
                              f"({self._no_room(b.type, b.group, Member(1000 * count, '', ''))})")
        self._resize(b, size)
        self._put(claims.key(claim.uid), b, Member(1000 * count, "", ""))
        return count

    def _user_claim(self, key: str) -> str:
        b = self.where.get(key)
        return b.members[key].claim if b is not None else ""

    def _user_resources(self, key: str, c: Container) -> Resources:
        return self._resources(c.resources, self.where[key], self.where[key].members[key])

    def describe_claim(self, uid: str) -> dict[str, Any] | None:
        claim, b = self.claims.get(uid), self.where.get(claims.key(uid))
        if claim is None or b is None:
            return None
        return {"device": claim.device, "balloon": b.name, "cpus": str(b.cpus),
                "mems": str(self._mems(b.cpus, b.type.memory_types or annotations.DEFAULT_MEMORY)),
                "users": self._claim_users(uid), "unprepared": uid in self.unprepared}

    def _group(self, t: BalloonType, container: Container, pod: Pod) -> str:
        return substitute(t.group_by, container, pod) if t.group_by else ""

    def _classes(self, container: Container, pod: Pod, t: BalloonType) -> dict[str, str]:
        """The container's class annotations, else its type's classes, else its QoS class."""
        classes = class_names(container, pod)
        merged = annotations.merged(container, pod)
        for controller, named in t.classes.items():
            if named and effective_annotation(merged, CLASS_ANNOTATIONS[controller], container.name) is None:
                classes[controller] = named
        return classes

    def _put(self, key: str, b: Balloon, m: Member) -> None:
        b.members[key] = m
        self.where[key] = b

    def _remove(self, key: str) -> tuple[Balloon, Member] | None:
        """Take a member out of its balloon, deflating or dropping the balloon."""
        self.preserved.discard(key)
        self.orphans.pop(key, None)
        b = self.where.pop(key, None)
        if b is None:
            return None
        m = b.members.pop(key)
        t = b.type
        if not b.members and not t.on_reserved and \
                sum(1 for x in self.balloons if x.type is t) > t.min_balloons:
            self.balloons.remove(b)
        else:
            size = self._size(t, b.milli, bool(b.members))
            self._resize(b, len(b.cpus) if size is None else size)
        return b, m

    def update(self, container: Container, requested: Resources, view: View) -> Decision:
        b = self.where.get(container.key)
        if b is None:
            return Decision()
        return Decision(resources=self._resources(requested, b, b.members[container.key]))

    def resize(self, container: Container, pod: Pod, requested: Resources, view: View) -> Decision:
        b = self.where.get(container.key)
        if b is None:
            return self.allocate(replace(container, requested=requested), pod, view)
        old = b.members[container.key]
        milli = container_requirements(replace(container, requested=requested), pod).cpu_request
        size = self._size(b.type, b.milli - old.milli + milli, True)
        if not b.type.on_reserved and (size is None or size - len(b.cpus) > len(self.free(b.type))):
            raise PolicyError(f"container {pod.namespace}/{pod.name}/{container.name}: balloon {b.name} cannot "
                              f"grow to {milli}m for it ({self._no_room(b.type, b.group, replace(old, milli=milli))})")
        before = self._snapshot()
        m = replace(old, milli=milli)
        b.members[container.key] = m
        self._resize(b, size or 0)
        resources = self._resources(requested, b, m)
        resources.cpu_shares = milli_to_shares(milli)
        return Decision(resources=resources, updates=self._updates(before, view, container.key))

    def rename(self, old_key: str, new_key: str) -> None:
        if old_key in self.preserved:
            self.preserved.discard(old_key)
            self.preserved.add(new_key)
        b = self.where.pop(old_key, None)
        if b is not None:
            b.members[new_key] = b.members.pop(old_key)
            self.where[new_key] = b

    def fallback(self) -> list[str]:
        wanted = sorted({m.wanted for b in self.balloons for m in b.members.values() if m.wanted})
        out = [f"no balloon of type {t} could be had: its containers asking for no CPU time run on the reserved "
               f"CPUs {self.reserved}" for t in wanted]
        for t in sorted(set(self.orphans.values())):
            count = sum(1 for x in self.orphans.values() if x == t)
            out.append(f"balloon type {t} is no longer configured: {count} container(s) annotated for it run where "
                       "their namespace puts them")
        for b in self.balloons:
            cpus = self.reserved | b.cpus
            if b.type.name == RESERVED and b.milli > 1000 * len(cpus):
                why = "no MinCPUs or MaxCPUs of a reserved type" if not b.type.grows else \
                    f"MaxCPUs {b.type.max_cpus}" if b.type.max_cpus and len(cpus) >= b.type.max_cpus else "no free CPUs"
                out.append(f"balloon {b.name}: its containers request {b.milli}m on {len(cpus)} CPUs {cpus} "
                           f"({why} to grow by)")
        return out

    def describe_pools(self) -> list[dict[str, Any]]:
        out = []
        for b in sorted(self.balloons, key=lambda b: (b.type.order, b.index)):
            cpus = self.reserved | b.cpus if b.type.on_reserved else b.cpus
            runs = self._runs_on(b, Member(0, "", ""))
            out.append(pool_entry(self.topo, b.name, cpus, runs, reserved=cpus & self.reserved,
                                  isolated=cpus & self.isolated, containers=len(b.members), requested=b.milli,
                                  free=1000 * len(cpus) - b.milli,
                                  elsewhere=len(b.members) if not b.cpus and not b.type.on_reserved else 0,
                                  type=b.type.name, cpu_class=b.type.cpu_class))
        return out

    def describe_grant(self, key: str) -> dict[str, Any] | None:
        b = self.where.get(key)
        if b is None:
            return None
        doc = {"pool": b.name, "exclusive": "", "shared_milli": b.members[key].milli,
               "kind": "reserved" if b.type.name == RESERVED else "shared"}
        if b.members[key].wanted:
            doc["fallback"] = "reserved"
        return doc

    def export_state(self) -> dict[str, Any]:
        return {"balloons": [b.to_dict() for b in self.balloons],
                "preserved": sorted(self.preserved), **claims.export(self.claims, self.unprepared)}

    def reconfigure(self, config: Mapping[str, Any], view: View) -> Decision:
        """Keep every balloon and its containers under a new configuration when each container still
        belongs to its balloon's type and group and every balloon can be sized to the new limits;
        the balloons are then only resized. Otherwise NotImplementedError: the engine re-places every
        container under a new instance. PolicyError: the configuration is bad, nothing changed."""
        fresh = type(self)(config, self.topology)
        try:
            fresh.restore_state(self.export_state())
            for key, b in fresh.where.items():
                if claims.is_claim(key) or b.members[key].claim:
                    if b.members[key].claim and not fresh.claims.get(b.members[key].claim):
                        raise PolicyError(f"container {key} uses a claim that is not prepared")
                    continue
                c = view.containers.get(key)
                pod = view.pods.get(c.pod_id) if c is not None else None
                if c is None or pod is None or b.members[key].wanted:
                    raise PolicyError(f"container {key} is not known or not in a balloon of its type")
                t = fresh._type_of(c, pod)
                if t is not b.type or fresh._group(t, c, pod) != b.group:
                    raise PolicyError(f"container {key} now belongs to balloon type {t.name}")
            for b in fresh.balloons:
                size = fresh._size(b.type, b.milli, bool(b.members))
                if not b.type.on_reserved and (size is None or size - len(b.cpus) > len(fresh.free(b.type))):
                    raise PolicyError(f"balloon {b.name} cannot hold its containers under the new limits")
                fresh._resize(b, size)
        except PolicyError:
            raise NotImplementedError from None
        updates = {}
        for key, b in fresh.where.items():
            c = view.containers.get(key)
            if c is None:  # a claim's own entry
                continue
            now = fresh._resources(c.resources, b, b.members[key])
            if (now.cpuset_cpus, now.cpuset_mems) != (c.resources.cpuset_cpus, c.resources.cpuset_mems):
                updates[key] = now
        self.__dict__.update(fresh.__dict__)
        return Decision(updates=updates)

    def restore_state(self, data: Mapping[str, Any]) -> None:
        """Reinstate persisted balloons exactly; PolicyError (nothing changed) if any cannot be."""
        taken = EMPTY

        def restored(d: Mapping[str, Any]) -> Balloon:
            nonlocal taken
            t = self.types.get(str(d["type"]))
            if t is None:
                raise PolicyError(f"persisted balloon of type {d['type']!r}, which does not exist now")
            parts = [restored(p) for p in d.get("parts") or []]
            kinds = tuple(p.type.name for p in parts)
            if kinds != t.components and not (t.balance_components and len(kinds) == 1 and kinds[0] in t.components):
                raise PolicyError(f"persisted balloon {t.name}[{d['index']}] has other components than its type now")
            cpus = EMPTY if t.on_reserved and t.name != RESERVED else CPUSet.parse(str(d.get("cpus", "")))
            if parts:
                cpus = _union(p.cpus for p in parts)
            elif not cpus <= self.allocatable or not cpus.isdisjoint(taken):
                raise PolicyError(f"persisted balloon {t.name}[{d['index']}] holds CPUs {cpus} that are not free "
                                  f"to balloons now")
            taken |= cpus
            members = {k: Member.from_dict(m) for k, m in (d.get("members") or {}).items()
                       if not k.startswith("pending:")}
            return Balloon(t, int(d["index"]), cpus, str(d.get("group", "")), members, parts)

        balloons = [restored(d) for d in data.get("balloons") or []]
        for t in self.settings.types:
            if t.on_reserved and not any(b.type is t for b in balloons):
                balloons.insert(0, Balloon(t, 0))
        with undone_on_failure(self._save, self._load):
            self.balloons = balloons
            self.where = {k: b for b in balloons for k in b.members}
            self.preserved = {k for k in data.get("preserved") or [] if not k.startswith("pending:")}
            self.claims, self.unprepared = claims.restore(data)
            lost = [u for u in self.claims if claims.key(u) not in self.where or not self.where[claims.key(u)].type.dra]
            if lost:
                raise PolicyError(f"{self.claims[lost[0]].who} was on a balloon this configuration has not")
            self._make_min_balloons()
