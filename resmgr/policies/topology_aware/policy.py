"""The `topology-aware` policy: each container in the tightest pool of the hardware tree.

Every container gets a grant in one pool of the tree (tree.py): reserved CPUs (kube-system and
containers asking for them), exclusive CPUs (kernel-isolated or sliced off the pool's shared CPUs)
and/or a share of the pool's shared CPUs, and the pool's memory nodes of the requested memory
types. A pool's shared CPUs shrink and grow as exclusive grants come and go, and every shared user
of a pool is re-pinned when they do. A grant whose memory no longer fits where it is has its memory
widened to the nearest pool up the tree where it does.

The rooms: request.py (what a container asks), placement.py (which pool, which CPUs),
accounts.py (what the grants leave each pool), this file (the policy interface: grants made,
changed and released, claims held, state kept and described).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from resmgr.model import Claim, Container, IrqPlan, Pod, Resources, SchedulingClass
from resmgr.policies.base import Decision, Policy, PolicyError, View, class_names, container_requirements, kept
from resmgr.policies.toolkit import claims, cpuvalues, scheduling
from resmgr.policies.toolkit.allocator import one_thread_per_core
from resmgr.policies.toolkit.grants import Grant
from resmgr.policies.toolkit.options import Option, reserved_namespaces
from resmgr.policies.topology_aware.accounts import Accounts
from resmgr.policies.topology_aware.describe import describe_grant, describe_pools, restored
from resmgr.policies.topology_aware.dra import Devices
from resmgr.policies.topology_aware.placement import Placement
from resmgr.policies.topology_aware.request import LEVELS, Asking, Settings
from resmgr.policies.topology_aware.tree import Pool, TreeError, build, owner
from resmgr.requests import Requirements, milli_to_shares
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import MemoryType, Topology

OPTIONS = (
    Option("PinCPU", "boolean", True, "write the containers' cpusets"),
    Option("PinMemory", "boolean", True, "write the containers' memory nodes"),
    Option("PreferIsolatedCPUs", "boolean", True, "1-CPU exclusive requests on kernel-isolated CPUs"),
    Option("PreferSharedCPUs", "boolean", False, "every container on shared CPUs"),
    Option("ReservedPoolNamespaces", "strings", None, "namespaces (globs) on the reserved CPUs besides "
           "kube-system, which always is (policy.ReservedPoolNamespaces wins)"),
    Option("ColocatePods", "boolean", False, "a pod's containers in the same pool"),
    Option("ColocateNamespaces", "boolean", False, "a namespace's containers in the same pool"),
    Option("ExclusiveInOneLeaf", "boolean", True, "exclusive CPUs no leaf can give by its own accounting come "
           "from one leaf by the machine's capacity (its shared containers run on the parent's shared CPUs "
           "meanwhile); false: sliced over several leaves of a parent, as nri-plugins does"),
    Option("ReservedPoolCPUClass", "string", "", "the CPU class (cpu.Classes) of the reserved CPUs"),
    Option("SharedPoolCPUClass", "string", "", "the CPU class of the shared CPUs (every pool's)"),
    Option("DefaultExclusiveCPUClass", "string", "", "the CPU class of exclusive CPUs"),
    Option("ControllableInterrupts", "strings", [], "the interrupts (globs) the irq-affinity annotation may "
           "claim or mask (none: every one)"),
    Option("SchedulingClasses", "objects", [], "scheduling classes (Linux scheduling policy, priority, nice, "
           "I/O priority) a container gets by annotation, namespace or QoS class", items=scheduling.OPTIONS),
    Option("NamespaceSchedulingClasses", "object", None, "namespace -> scheduling class"),
    Option("PodQoSSchedulingClasses", "object", None, "QoS class (Guaranteed, Burstable, BestEffort) -> "
           "scheduling class"),
    Option("UnlimitedBurstable", "string", "package", "the widest pool a Burstable container without a CPU "
           "limit may go to (system, package, die or numa; the unlimited-burstable annotation overrides it)",
           choices=LEVELS),
)


class TopologyAwarePolicy(Policy):
    name = "topology-aware"
    description = ("pools from the hardware tree (sockets, dies, NUMA nodes, L3): each container in the tightest "
                   "pool that fits, with CPUs and memory from the same place")
    options = OPTIONS
    shared_pools = True

    def __init__(self, config: Mapping[str, Any] | None = None, topology: Topology | None = None) -> None:
        super().__init__(config, topology)
        self.require_topology()
        options = self.read_options()
        self.pin_cpu, self.pin_memory = options["PinCPU"], options["PinMemory"]
        self.controllable_irqs = tuple(options["ControllableInterrupts"])
        self.cpu_class_of = {"reserved": options["ReservedPoolCPUClass"], "shared": options["SharedPoolCPUClass"],
                             "exclusive": options["DefaultExclusiveCPUClass"]}
        self.scheduling = scheduling.Scheduling.read(
            options["SchedulingClasses"], options["NamespaceSchedulingClasses"], options["PodQoSSchedulingClasses"],
            f"policy.{self.name}")
        settings = Settings(
            prefer_isolated=options["PreferIsolatedCPUs"], prefer_shared=options["PreferSharedCPUs"],
            colocate_pods=options["ColocatePods"], colocate_namespaces=options["ColocateNamespaces"],
            unlimited_burstable=LEVELS.index(options["UnlimitedBurstable"]),
            reserved_namespaces=tuple(reserved_namespaces(
                self.config.get("ReservedPoolNamespaces", options["ReservedPoolNamespaces"]))),
            controllable_irqs=self.controllable_irqs)

        cpus = cpuvalues.resolve_cpus(self.config, topology)
        available, isolated, reserved = cpus.available, cpus.isolated, cpus.reserved
        if not available - isolated - reserved:
            raise PolicyError(f"{self.name}: no CPUs left to share (available {available}, isolated "
                              f"{isolated or 'none'}, reserved {reserved or 'none'})")
        try:
            self.pools = build(topology, available, isolated, reserved)
        except TreeError as err:
            raise PolicyError(f"{self.name}: {err}") from None
        self.available, self.isolated, self.reserved = available, isolated, reserved
        reserved_pool = owner(self.pools, reserved) if reserved else None
        present = frozenset(self.pools[0].mems)
        self.accounts = Accounts(self.pools, reserved)
        self.asking = Asking(settings, self.accounts, topology, reserved_pool, present)
        self.placement = Placement(self.accounts, topology, isolated, reserved_pool, present,
                                   options["ExclusiveInOneLeaf"])
        self.dra = Devices(topology, self.pools, self.accounts, self.placement)
        self.preparing = claims.Preparing(self.dra, self._snapshot, self._updates)

    # -- what tests and the status read ----------------------------------------------------
    @property
    def grants(self) -> Any:
        return self.accounts.grants

    @property
    def by_name(self) -> dict[str, Pool]:
        return self.accounts.by_name

    @property
    def claims(self) -> dict[str, Claim]:
        """The claims it holds CPUs for, by UID (those unprepared while in use too)."""
        return self.dra.book.claims

    def prepared_claims(self) -> dict[str, Claim]:
        return self.dra.book.usable()

    def sharable(self, pool: Pool) -> CPUSet:
        return self.accounts.sharable(pool)

    def shared_cpus(self, pool: Pool) -> CPUSet:
        return self.accounts.shared_cpus(pool)

    def fallback(self) -> list[str]:
        return self.accounts.fallback()

    # -- resources -------------------------------------------------------------------------
    def cpus_of_grant(self, g: Grant) -> CPUSet:
        """The CPUs the grant's container runs on."""
        pool = self.accounts.by_name[g.pool]
        if g.claim:
            held = self.grants.get(claims.key(g.claim))
            return held.exclusive if held is not None else EMPTY
        cpus = g.exclusive
        if g.reserved:
            cpus |= self.reserved
        if g.on_shared:
            cpus |= self.accounts.shared_cpus(pool)
        return one_thread_per_core(self.topology, cpus) if g.hide_ht else cpus

    def mems_of_grant(self, g: Grant, cpus: CPUSet | None = None) -> CPUSet:
        """Its memory nodes; cpus: the grant's CPUs when the caller has them already."""
        pool = self.accounts.by_name[g.memory_pool]
        if g.cold:  # a cold start: its memory allocated on PMEM, where it need not be migrated to
            return pool.mems_of((MemoryType.PMEM,))
        mems = pool.mems_of(g.mem_types) or pool.all_mems
        if g.mem_pool:  # moved up for room: the wider pool's memory on purpose
            return mems
        # Memory follows the CPUs the container really has: a NUMA node with CPUs, none of them its
        # own (out of AvailableResources, or all taken), is left out, as nri-plugins does, unless
        # the container's memory needs it (a pool chosen for its memory keeps all of it).
        cpus = self.cpus_of_grant(g) if cpus is None else cpus
        foreign = CPUSet(n.id for n in self.topology.nodes.values() if n.cpus and not n.cpus & cpus)
        near = mems - foreign
        if not near and g.on_shared and not g.exclusive:
            # Its pool's shared CPUs are all taken: it runs on an ancestor's (or the reserved CPUs),
            # and its memory goes there too.
            wider = self.accounts.lender(pool) or self.pools[0]
            near = (wider.mems_of(g.mem_types) or wider.all_mems) - foreign
        if not near or sum(self.topology.nodes[n].memory for n in near) < g.memory:
            return mems
        return near

    def _placed(self, g: Grant) -> tuple[CPUSet, CPUSet]:
        """The grant's CPUs and memory nodes (the CPUs read once: the memory follows them)."""
        cpus = self.cpus_of_grant(g)
        return cpus, self.mems_of_grant(g, cpus)

    def _resources(self, base: Resources, g: Grant) -> Resources:
        cpus, mems = self._placed(g)
        out = base.with_cpus(str(cpus)) if self.pin_cpu and g.pin_cpu or g.claim else base.with_cpus(base.cpuset_cpus)
        if g.claim:
            out.cpu_shares = claims.shares(len(cpus), len(self.dra.users(g.claim)))
        if self.pin_memory and g.pin_memory:
            if mems:
                out.cpuset_mems = str(mems)
        return out

    def _snapshot(self) -> list[CPUSet]:
        return [self.accounts.shared_cpus(p) for p in self.pools]

    def _updates(self, before: list[CPUSet], view: View, skip: str) -> dict[str, Resources]:
        """Shared users of every pool whose shared CPUs moved."""
        updates: dict[str, Resources] = {}
        if not self.pin_cpu:
            return updates
        for pool in self.pools:
            if before[pool.id] == self.accounts.shared_cpus(pool):
                continue
            for key in sorted(self.accounts.users[pool.id]):
                c = view.containers.get(key)
                if key != skip and c is not None:
                    now = self._resources(c.resources, self.grants[key])
                    if now != c.resources:  # a preserved container's may not change
                        updates[key] = now
        return updates

    # -- the policy interface -------------------------------------------------------------
    def allocate(self, container: Container, pod: Pod, view: View) -> Decision:
        return self._allocate(container, pod, view, CPUSet.parse_or_empty(container.previous))

    def adopt(self, container: Container, pod: Pod, view: View) -> Decision:
        return self._allocate(container, pod, view, *kept(container))

    def _allocate(self, container: Container, pod: Pod, view: View, *keep: CPUSet) -> Decision:
        """Place the container; an exclusive grant takes the first CPUs of keep that would do instead."""
        req = container_requirements(container, pod)
        claim = claims.claim_of(container, pod, self.dra.book.usable())
        if claim is not None:
            return self._on_claim(container, pod, req, claim, view)
        before = self._snapshot()
        with self.grants.transaction():  # a failed re-allocation keeps what it had
            self.grants.remove(container.key)
            r = self.asking.request(container, pod, req, view)
            home = self.placement.home(r.exclusive, keep)
            if home:  # its node first, as where it ran before: the node with most room may be another
                r = replace(r, previous=home)
            grant = self.placement.place(r)
            for cpus in keep:
                if grant.exclusive and len(cpus) == len(grant.exclusive):
                    if cpus != grant.exclusive:
                        grant = self.placement.keep(container.key, grant, cpus)
                    if grant.exclusive == cpus:
                        break
            self.grants.add(container.key, grant)
        classes = self._classes(container, pod)
        resources = self._resources(container.requested, grant)
        resources.cpu_shares = milli_to_shares(req.cpu_request)
        return Decision(resources=resources, classes=classes, updates=self._updates(before, view, container.key),
                        warm_after=r.cold if grant.cold else 0.0)

    def _classes(self, container: Container, pod: Pod) -> dict[str, str]:
        """Its RDT and block-I/O classes, and its scheduling class where it has one."""
        classes = class_names(container, pod)
        sched = self.scheduling.of(container, pod)
        if sched:
            classes["sched"] = sched
        return classes

    def irq_plan(self) -> IrqPlan:
        """Interrupts the irq-affinity annotations claim on, or mask off, the containers' exclusive CPUs."""
        claims: list[tuple[tuple[str, ...], CPUSet]] = []
        masks: list[tuple[tuple[str, ...], CPUSet]] = []
        late: list[tuple[tuple[str, ...], CPUSet]] = []
        for _, g in sorted(self.grants.items()):
            if g.irq_claim and g.exclusive:
                claims.append((g.irq_claim, g.exclusive))
            if g.irq_mask and g.exclusive:
                (late if g.irq_claim_first else masks).append((g.irq_mask, g.exclusive))
        return IrqPlan(tuple(claims), tuple(masks), controllable=self.controllable_irqs, late_masks=tuple(late))

    def cpu_classes(self) -> dict[str, CPUSet]:
        """The reserved, shared and exclusive CPUs in their pool classes."""
        cpus = {"reserved": self.reserved, "exclusive": self.accounts.taken,
                "shared": self.accounts.sharable(self.pools[0])}
        out: dict[str, CPUSet] = {}
        for kind, name in self.cpu_class_of.items():
            if name:
                out[name] = out.get(name, EMPTY) | cpus[kind]
        return out

    def scheduling_class(self, name: str) -> SchedulingClass | None:
        return self.scheduling.classes.get(name)

    def update(self, container: Container, requested: Resources, view: View) -> Decision:
        g = self.grants.get(container.key)
        if g is None:
            return Decision()
        if g.claim:  # its CPUs are the claim's, whatever the request says
            return Decision(resources=self._resources(requested, g))
        memory = requested.memory_limit_in_bytes
        if memory > 0 and memory != g.memory:
            self.grants.remove(container.key)
            self.grants.add(container.key, replace(g, memory=memory))
            self._guard_memory([container.key])
            g = self.grants[container.key]
        return Decision(resources=self._resources(requested, g))

    def resize(self, container: Container, pod: Pod, requested: Resources, view: View) -> Decision:
        held = self.grants.get(container.key)
        if held is not None and held.claim:
            return self.update(container, requested, view)
        if held is not None and not held.exclusive and requested.cpu() == container.requested.cpu():
            return self.update(container, requested, view)  # memory alone: re-accounted where it is
        keep = held.exclusive if held is not None else EMPTY
        return self._allocate(replace(container, requested=requested), pod, view, keep)

    def _guard_memory(self, keys: list[str]) -> None:
        """Widen the memory of grants that no longer fit to the nearest pool up that fits."""
        for key in keys:
            g = self.grants[key]
            if not g.memory:
                continue
            pool = self.by_name[g.memory_pool]
            self.grants.remove(key)
            target = pool
            while self.accounts.memory_free(target, g.mem_types) < g.memory and target.parent is not None:
                target = target.parent
            self.grants.add(key, replace(g, mem_pool="" if target.name == g.pool else target.name))

    def release(self, container: Container, view: View) -> Decision:
        """The container's grant goes: the shared users of pools whose shared CPUs grow move; a
        claim's other users get its CPU time, and an unprepared claim's CPUs go with its last user."""
        before = self._snapshot()
        g = self.grants.remove(container.key)
        if g is None:
            return Decision()
        if g.claim and self.dra.book.last_user_gone(g.claim, self.dra.users(g.claim)):
            self.dra.give_back(g.claim)
        updates = self._updates(before, view, container.key)
        if g.claim:
            updates.update(self._sharers(g.claim, view, container.key))
        return Decision(updates=updates)

    def warm(self, key: str, view: View) -> Decision:
        g = self.grants.get(key)
        c = view.containers.get(key)
        if g is None or not g.cold:
            return Decision()
        self.grants.remove(key)
        self.grants.add(key, replace(g, cold=False))
        if c is None:
            return Decision()
        return Decision(updates={key: self._resources(c.resources, self.grants[key])})

    def cold(self) -> list[str]:
        return sorted(k for k, g in self.grants.items() if g.cold)

    def rename(self, old_key: str, new_key: str) -> None:
        g = self.grants.remove(old_key)
        if g is not None:
            self.grants.add(new_key, g)

    def rebalance(self, view: View) -> Decision:
        """Place every shared-only container anew, biggest first; exclusive grants stay."""
        movable = [k for k, g in self.grants.items() if g.kind == "shared" and k in view.containers
                   and view.containers[k].pod_id in view.pods]
        before = {k: self._placed(g) for k, g in self.grants.items()}
        try:
            with self.grants.transaction():
                old = {k: self.grants.remove(k) for k in movable}
                movable.sort(key=lambda k: (-old[k].shared, -old[k].memory, k))
                for key in movable:
                    c = view.containers[key]
                    pod = view.pods[c.pod_id]
                    r = self.asking.request(c, pod, container_requirements(c, pod), view)
                    placed = self.placement.grant(self.placement.choose(r), r)  # shared only: never relaxed
                    self.grants.add(key, placed)
        except PolicyError:
            # The new arrangement has no room for everyone, and the old room may be taken already:
            # the old arrangement, which fitted, is back.
            return Decision()
        updates = {}
        for key, g in self.grants.items():
            c = view.containers.get(key)
            if c is not None and before.get(key) != self._placed(g):
                updates[key] = self._resources(c.resources, g)
        return Decision(updates=updates)

    def reconfigure(self, config: Mapping[str, Any], view: View) -> Decision:
        """Take a new configuration keeping every grant where it is, or raise and change nothing."""
        fresh = type(self)(config, self.topology)
        fresh.restore_state(self.export_state())
        updates = {}
        for key, g in fresh.grants.items():
            c = view.containers.get(key)
            if c is None:
                continue
            now = fresh._resources(c.resources, g)
            if (now.cpuset_cpus, now.cpuset_mems) != (c.resources.cpuset_cpus, c.resources.cpuset_mems):
                updates[key] = now
        self.__dict__.update(fresh.__dict__)
        return Decision(updates=updates)

    def export_state(self) -> dict[str, Any]:
        return {"grants": {k: g.to_dict() for k, g in sorted(self.grants.items())}, **self.dra.book.export()}

    def restore_state(self, data: Mapping[str, Any]) -> None:
        """Reinstate persisted grants exactly; PolicyError (nothing kept) if any cannot be."""
        grants = {k: Grant.from_dict(v) for k, v in (data.get("grants") or {}).items()
                  if not k.startswith("pending:")}
        self.grants.clear()
        self.dra.book.restore(data)
        try:
            for key, g in sorted(grants.items()):
                if g.claim and g.claim not in self.claims:
                    raise PolicyError(f"grant of {key} uses claim {g.claim}, which is not prepared")
                self._restore_one(key, g)
            problem = self.accounts.overcommitted()
            if problem:
                raise PolicyError(problem)
        except PolicyError:
            self.grants.clear()
            self.dra.book.clear()
            raise
        self._guard_memory(sorted(self.grants))

    def _restore_one(self, key: str, g: Grant) -> None:
        self.grants.add(key, restored(key, g, self.placement.reserved_pool, self.by_name, self.accounts.taken))

    def describe_pools(self) -> list[dict[str, Any]]:
        return describe_pools(self.topology, self.pools, self.accounts, self.grants.values())

    def describe_grant(self, key: str) -> dict[str, Any] | None:
        g = self.grants.get(key)
        if g is None:
            return None
        return describe_grant(g, self.cpus_of_grant(g), self.by_name[g.pool], self.accounts)

    # -- DRA claims (docs/dra.md; dra.py) ----------------------------------------------------
    def devices(self) -> list[dict[str, Any]]:
        return self.dra.listed()

    def prepare_claim(self, claim: Claim, view: View) -> Decision:
        return self.preparing.prepare(claim, view)

    def unprepare_claim(self, uid: str, view: View) -> Decision:
        return self.preparing.unprepare(uid, view)

    def _on_claim(self, container: Container, pod: Pod, req: Requirements, claim: Claim, view: View) -> Decision:
        """A container on a claim's CPUs, with the memory of the claim's pool; the other users of the
        claim get their new share of its CPU time."""
        pool = self.dra.pool_of(claim.uid)
        with self.grants.transaction():
            self.grants.remove(container.key)
            self.grants.add(container.key, Grant(pool.name, memory=req.memory_limit or req.memory_request,
                                                 claim=claim.uid))
        return Decision(resources=self._resources(container.requested, self.grants[container.key]),
                        classes=self._classes(container, pod), updates=self._sharers(claim.uid, view, container.key))

    def _sharers(self, uid: str, view: View, skip: str) -> dict[str, Resources]:
        """The claim's users but skip, with their new part of its CPU time."""
        out = {}
        for key in self.dra.users(uid):
            c = view.containers.get(key)
            if key != skip and c is not None:
                out[key] = self._resources(c.resources, self.grants[key])
        return out

    def describe_claim(self, uid: str) -> dict[str, Any] | None:
        return self.dra.describe(uid)
