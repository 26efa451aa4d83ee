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

The rooms: types.py (the configuration), model.py (balloons and members), fleet.py (the balloons'
CPUs and where a member runs), choice.py (which balloon a container goes to), this file (the policy
interface: members placed, moved and released, claims held, state kept and described).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from resmgr.model import Claim, Container, IrqPlan, Pod, QOSClass, Resources, SchedulingClass
from resmgr.policies.balloons.choice import Choice
from resmgr.policies.balloons.describe import cpu_classes, describe_grant, describe_pools, fallback, irq_plan
from resmgr.policies.balloons.devices import Devices
from resmgr.policies.balloons.fleet import Fleet
from resmgr.policies.balloons.model import BALLOON, Balloon, Member, Saved, hint
from resmgr.policies.balloons.types import POLICY_OPTIONS, RESERVED, parse
from resmgr.policies.base import Decision, Policy, PolicyError, View, container_requirements
from resmgr.policies.toolkit import annotations, claims, cpuvalues
from resmgr.policies.toolkit.allocator import take_cpus
from resmgr.policies.toolkit.undo import undone_on_failure
from resmgr.requests import milli_to_shares
from resmgr.topology import interrupts
from resmgr.topology.cpuset import EMPTY, CPUSet, union
from resmgr.topology.model import MemoryType, Topology


class BalloonsPolicy(Policy):
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
        for t in self.settings.types:  # what a type claims of the machine's interrupts (nri-plugins checks it so)
            if problems := interrupts.denied(t.irq_claim, self.settings.controllable_irqs, topology.interrupts):
                raise PolicyError(f"policy.balloons: balloon type {t.name}: " + "; ".join(problems))
        self.fleet = Fleet(self.settings, topology, self.isolated, self.reserved, self.allocatable)
        self.choice = Choice(self.fleet)
        self.where: dict[str, Balloon] = {}  # members' balloons, by container key
        self.preserved: set[str] = set()
        # DRA: claims prepared on balloons of DRA types, each a member of its balloon (keyed claims.key).
        self.book = claims.ClaimBook()
        self.dra = Devices(self.fleet, self.settings)
        self.fleet.make_min_balloons()

    # -- where a member runs, and who moved ---------------------------------------------------
    def _resources(self, base: Resources, b: Balloon, m: Member) -> Resources:
        cpus = self.fleet.runs_on(b, m)
        out = base.with_cpus(str(cpus) if self.settings.pin_cpu and m.pin_cpu else base.cpuset_cpus)
        if m.claim:  # its own request, and its part of the claim's CPUs
            users = len(self._claim_users(m.claim))
            out.cpu_shares = milli_to_shares(m.milli + 1000 * self.book.held[m.claim] // max(users, 1)) \
                if m.claim in self.book.held else milli_to_shares(m.milli)
        if b.type.pin_memory and m.pin_memory and self.topo.nodes:
            mems = self.fleet.mems(cpus, self.fleet.mem_types(b, m))
            if mems:
                out.cpuset_mems = str(mems)
        return out

    def _snapshot(self) -> dict[str, tuple[CPUSet, CPUSet]]:
        """Every member's CPUs and memory nodes (computed once per balloon and kind of member)."""
        out = {}
        for b in self.fleet.balloons:
            seen: dict[tuple[bool, frozenset[MemoryType]], tuple[CPUSet, CPUSet]] = {}
            for key, m in b.members.items():
                kind = (m.hide_ht, m.mem_types)
                if kind not in seen:
                    cpus = self.fleet.runs_on(b, m)
                    seen[kind] = cpus, self.fleet.mems(cpus, self.fleet.mem_types(b, m))
                out[key] = seen[kind]
        return out

    def _updates(self, before: Mapping[str, tuple[CPUSet, CPUSet]], view: View, skip: str) -> dict[str, Resources]:
        updates = {}
        for key, now in self._snapshot().items():
            c = view.containers.get(key)
            if key != skip and c is not None and before.get(key) != now:
                updates[key] = self._resources(c.resources, self.where[key], self.where[key].members[key])
        return updates

    def _save(self) -> Saved:
        """What undoing a failed change needs: the balloons, and each one's CPUs, members and parts."""
        nodes: list[tuple[Balloon, CPUSet, dict[str, Member], list[Balloon]]] = []

        def keep(b: Balloon) -> None:
            nodes.append((b, b.cpus, dict(b.members), list(b.parts)))
            for p in b.parts:
                keep(p)

        for b in self.fleet.balloons:
            keep(b)
        return list(self.fleet.balloons), nodes, set(self.preserved)

    def _load(self, saved: Saved) -> None:
        self.fleet.balloons, nodes, self.preserved = list(saved[0]), saved[1], set(saved[2])
        for b, cpus, members, parts in nodes:
            b.cpus, b.members, b.parts = cpus, members, parts
        self.where = {k: b for b in self.fleet.balloons for k in b.members}

    # -- the policy interface ----------------------------------------------------------------
    def allocate(self, container: Container, pod: Pod, view: View) -> Decision:
        before = self._snapshot()
        with undone_on_failure(self._save, self._load):
            self._remove(container.key)
            if any(e(container, pod) for e in self.settings.preserve):
                self.preserved.add(container.key)
                return Decision(updates=self._updates(before, view, container.key))
            m = self.choice.member(container, pod)
            if container.claims:
                return self._on_claim(container, pod, m, view, before)
            t = self.choice.type_of(container, pod)
            if t.dra:
                raise PolicyError(f"container {pod.namespace}/{pod.name}/{container.name}: balloon type {t.name} is "
                                  "published as DRA devices; its balloons are had only through a resource claim")
            group = self.choice.group(t, container, pod)
            previous = CPUSet.parse_or_empty(container.previous)
            try:
                b, size = self.choice.choose(t, group, m, previous)
            except PolicyError:
                if m.milli:
                    raise
                # Nothing asked, nothing refused: the reserved CPUs.
                b = next(x for x in self.fleet.balloons if x.type.name == RESERVED)
                size, m = 0, replace(m, wanted=t.name)
        guaranteed = pod.qos_class == QOSClass.GUARANTEED
        if b is None:
            b = self.fleet.new_balloon(t, size, group, guaranteed, previous)
        else:
            self.fleet.resize(b, size, guaranteed, previous)
        self._put(container.key, b, m)
        if b.type.name == RESERVED:
            self.fleet.fit_reserved(b)
        classes = self.choice.classes(container, pod, b.type)
        resources = self._resources(container.requested, b, m)
        resources.cpu_shares = milli_to_shares(m.milli)
        return Decision(resources=resources, classes=classes,
                        updates=self._updates(before, view, container.key))

    def _on_claim(self, container: Container, pod: Pod, m: Member, view: View,
                  before: Mapping[str, tuple[CPUSet, CPUSet]]) -> Decision:
        """A container using claims: in the balloon they were prepared on, with its request counted."""
        who = f"container {pod.namespace}/{pod.name}/{container.name}"
        usable = self.book.usable()
        held = {u: usable[u] for u in container.claims if u in usable}
        missing = [u for u in container.claims if u not in held]
        if missing:
            raise PolicyError(f"{who} uses claim {missing[0]}, which is not prepared on this node")
        homes = {u: self.where[claims.key(u)] for u in held}
        if len({id(b) for b in homes.values()}) > 1:
            named = " and ".join(f"{held[u].who} on balloon {b.name}" for u, b in sorted(homes.items()))
            raise PolicyError(f"{who} uses {named}: a container runs in one balloon")
        uid = sorted(held)[0]
        b = homes[uid]
        named = hint(container, pod, BALLOON)
        if named is not None and named.strip() != b.type.name:
            raise PolicyError(f"{who}: its balloon annotation names type {named.strip()}, but {held[uid].who} is on "
                              f"balloon {b.name} of type {b.type.name}")
        m = replace(m, claim=uid)
        size = self.fleet.size(b.type, b.milli + m.milli, True)
        if size is None or size - len(b.cpus) > len(self.fleet.free(b.type)):
            raise PolicyError(f"{who}: balloon {b.name} cannot grow by its {m.milli}m "
                              f"({self.choice.no_room(b.type, b.group, m)})")
        self.fleet.resize(b, size, pod.qos_class == QOSClass.GUARANTEED)
        self._put(container.key, b, m)
        updates = self._updates(before, view, container.key)
        updates.update(self._sharers(uid, view, container.key))  # the others' part of the claim's CPU time
        return Decision(resources=self._resources(container.requested, b, m),
                        classes=self.choice.classes(container, pod, b.type), updates=updates)

    # -- DRA claims (docs/dra.md) ------------------------------------------------------------
    @property
    def claims(self) -> dict[str, Claim]:
        """The claims it holds CPUs for, by UID (those unprepared while in use too)."""
        return self.book.claims

    def prepared_claims(self) -> dict[str, Claim]:
        return self.book.usable()

    def _claim_users(self, uid: str) -> list[str]:
        return sorted(k for k, b in self.where.items() if b.members[k].claim == uid)

    def devices(self) -> list[dict[str, Any]]:
        return self.dra.listed()

    def prepare_claim(self, claim: Claim, view: View) -> Decision:
        """Grow the claim's balloon by the claim's CPUs, a member of its own; a balloon still to come
        is made for it."""
        if not self.book.is_new(claim):
            return Decision()
        before = self._snapshot()
        b = self.dra.made().get(claim.device)
        to_come = self.dra.to_come()
        if b is not None:
            t, milli, held, group = b.type, b.milli, len(b.cpus), b.group
        elif claim.device in to_come:
            t, milli, held, group = to_come[claim.device][0], 0, 0, ""
        else:
            raise PolicyError(f"{claim.who}: this node has no device {claim.device} (it offers "
                              f"{', '.join(d['name'] for d in self.devices()) or 'none'})")
        count = claim.cpus or t.max_cpus
        member = Member(1000 * count, "", "")
        size = self.fleet.size(t, milli + 1000 * count, True)
        if size is None or size - held > len(self.fleet.free(t)):
            what = f"balloon {b.name} cannot grow by" if b is not None else f"a new {t.name} balloon cannot take"
            raise PolicyError(f"{claim.who}: {what} {count} CPU(s) ({self.choice.no_room(t, group, member)})")
        if b is None:
            b = self.fleet.new_balloon(t, size, index=to_come[claim.device][1])
        else:
            self.fleet.resize(b, size)
        self._put(claims.key(claim.uid), b, member)
        self.book.hold(claim, count)
        return Decision(updates=self._updates(before, view, ""))

    def unprepare_claim(self, uid: str, view: View) -> Decision:
        """Shrink the balloon by the claim's CPUs, or, while containers run on them, once the last one goes."""
        if not self.book.give_back_now(uid, self._claim_users(uid)):
            return Decision()
        before = self._snapshot()
        self._give_back(uid)
        return Decision(updates=self._updates(before, view, ""))

    def _give_back(self, uid: str) -> None:
        self._remove(claims.key(uid))
        self.book.drop(uid)

    def release(self, container: Container, view: View) -> Decision:
        """The container leaves its balloon, which deflates (or goes); a claim's other users get its
        CPU time, and an unprepared claim's CPUs go with its last user."""
        before = self._snapshot()
        removed = self._remove(container.key)
        if removed is None:
            return Decision()
        uid = removed[1].claim
        if uid and self.book.last_user_gone(uid, self._claim_users(uid)):
            self._give_back(uid)
        updates = self._updates(before, view, container.key)
        if uid:
            updates.update(self._sharers(uid, view, container.key))
        return Decision(updates=updates)

    def _sharers(self, uid: str, view: View, skip: str) -> dict[str, Resources]:
        """The claim's users but skip, with their new part of its CPU time."""
        out = {}
        for key in self._claim_users(uid):
            c = view.containers.get(key)
            if key != skip and c is not None:
                out[key] = self._resources(c.resources, self.where[key], self.where[key].members[key])
        return out


    def describe_claim(self, uid: str) -> dict[str, Any] | None:
        b = self.where.get(claims.key(uid))
        if uid not in self.book.claims or b is None:
            return None
        return {**self.book.describe(uid), "balloon": b.name, "cpus": str(b.cpus),
                "mems": str(self.fleet.mems(b.cpus, b.type.memory_types or annotations.DEFAULT_MEMORY)),
                "users": self._claim_users(uid)}

    def cpu_classes(self) -> dict[str, CPUSet]:
        return cpu_classes(self.fleet, self.reserved, self.allocatable, self.settings.idle_class)

    def irq_plan(self) -> IrqPlan:
        return irq_plan(self.fleet, self.settings.controllable_irqs)

    def scheduling_class(self, name: str) -> SchedulingClass | None:
        return self.settings.scheduling.classes.get(name)

    # -- members -----------------------------------------------------------------------------
    def _put(self, key: str, b: Balloon, m: Member) -> None:
        b.members[key] = m
        self.where[key] = b

    def _remove(self, key: str) -> tuple[Balloon, Member] | None:
        """Take a member out of its balloon, deflating or dropping the balloon."""
        self.preserved.discard(key)
        self.choice.orphans.pop(key, None)
        b = self.where.pop(key, None)
        if b is None:
            return None
        m = b.members.pop(key)
        t = b.type
        if not b.members and not t.on_reserved and \
                sum(1 for x in self.fleet.balloons if x.type is t) > t.min_balloons:
            self.fleet.balloons.remove(b)
        else:
            size = self.fleet.size(t, b.milli, bool(b.members))
            self.fleet.resize(b, len(b.cpus) if size is None else size)
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
        size = self.fleet.size(b.type, b.milli - old.milli + milli, True)
        if not b.type.on_reserved and (size is None or size - len(b.cpus) > len(self.fleet.free(b.type))):
            why = self.choice.no_room(b.type, b.group, replace(old, milli=milli))
            raise PolicyError(f"container {pod.namespace}/{pod.name}/{container.name}: balloon {b.name} cannot "
                              f"grow to {milli}m for it ({why})")
        before = self._snapshot()
        m = replace(old, milli=milli)
        b.members[container.key] = m
        self.fleet.resize(b, size or 0)
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
        return fallback(self.fleet, self.choice.orphans, self.reserved)

    def describe_pools(self) -> list[dict[str, Any]]:
        return describe_pools(self.topo, self.fleet, self.reserved, self.isolated)

    def describe_grant(self, key: str) -> dict[str, Any] | None:
        b = self.where.get(key)
        return None if b is None else describe_grant(b, key)

    def export_state(self) -> dict[str, Any]:
        return {"balloons": [b.to_dict() for b in self.fleet.balloons],
                "preserved": sorted(self.preserved), **self.book.export()}

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
                    if b.members[key].claim and b.members[key].claim not in fresh.claims:
                        raise PolicyError(f"container {key} uses a claim that is not prepared")
                    continue
                c = view.containers.get(key)
                pod = view.pods.get(c.pod_id) if c is not None else None
                if c is None or pod is None or b.members[key].wanted:
                    raise PolicyError(f"container {key} is not known or not in a balloon of its type")
                t = fresh.choice.type_of(c, pod)
                if t is not b.type or fresh.choice.group(t, c, pod) != b.group:
                    raise PolicyError(f"container {key} now belongs to balloon type {t.name}")
            for b in fresh.fleet.balloons:
                size = fresh.fleet.size(b.type, b.milli, bool(b.members))
                if not b.type.on_reserved and (size is None or size - len(b.cpus) > len(fresh.fleet.free(b.type))):
                    raise PolicyError(f"balloon {b.name} cannot hold its containers under the new limits")
                fresh.fleet.resize(b, size)
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
                cpus = union(p.cpus for p in parts)
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
            self.fleet.balloons = balloons
            self.where = {k: b for b in balloons for k in b.members}
            self.preserved = {k for k in data.get("preserved") or [] if not k.startswith("pending:")}
            self.book.restore(data)
            lost = [u for u in self.claims if claims.key(u) not in self.where or not self.where[claims.key(u)].type.dra]
            if lost:
                raise PolicyError(f"{self.claims[lost[0]].who} was on a balloon this configuration has not")
            self.fleet.make_min_balloons()
