"""The `podpools` policy: every container of a pod in one pool instance of dedicated CPUs.

Pool types are configured with the CPUs of each instance (`CPU`), how many pods an instance
holds (`MaxPods`) and how many CPUs the type gets in all (`Instances`: a number of
instances, `N CPUs`, or `N %` of the CPUs that are not reserved, less a `default` type's,
which are set aside first). Instances are made at
start, types in their order, each instance's CPUs chosen as every policy chooses them. A pod
annotated `pool.podpools.cri-resource-manager.intel.com: <type>` (or `pooltype.`) goes, all
its containers, to the instance of that type with the most free room (`FillOrder:
Balanced`) or the least (`Packed`); kube-system (ReservedPoolNamespaces) to the reserved
CPUs; the rest to the default pool: every CPU neither reserved nor in an instance (the
reserved CPUs when none is left), or as many as a `default` type's `CPU` says. A pod annotated
for a type the configuration has not (misspelt, or dropped while the pod runs) goes to the default
pool, as cri-resource-manager places it, and a notice says so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from resmgr.model import Claim, Container, Pod, Resources
from resmgr.policies.base import Decision, Policy, PolicyError, View, class_names, container_requirements
from resmgr.policies.podpool_devices import PodpoolDevices
from resmgr.policies.toolkit import annotations, claims, cpuvalues
from resmgr.policies.toolkit.allocator import take_cpus
from resmgr.policies.toolkit.describe import pool_entry
from resmgr.policies.toolkit.options import Option, in_namespaces, read, reserved_namespaces
from resmgr.requests import milli_to_shares
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.model import Topology

RESERVED, DEFAULT = "reserved", "default"


def _count(value: Any, where: str) -> Any:
    """Instances: N, "N CPUs" or "N %"; returned as (number, unit) with unit "", "cpus" or "%"."""
    text = str(value).strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(cpus?|%)?", text)
    if m is None or isinstance(value, bool):
        raise PolicyError(f"{where}: {value!r} is not a number of instances, 'N CPUs' or 'N %'")
    unit = {"cpu": "cpus", "cpus": "cpus", "%": "%"}.get(m.group(2) or "", "")
    if not unit and "." in m.group(1):
        raise PolicyError(f"{where}: {value!r}: a number of instances is a whole number")
    return float(m.group(1)), unit


def _quantity(key: str) -> Any:
    """Read {key: value} of the documented nested form (resources: {cpu: 2}, capacity: {pod: 1})."""
    def check(value: Any, where: str) -> Any:
        if value is None:
            return None
        if not isinstance(value, Mapping) or key not in {str(k).lower() for k in value}:
            raise PolicyError(f"{where}: expected {{{key}: ...}}")
        return next(v for k, v in value.items() if str(k).lower() == key)
    return check


TYPE_OPTIONS = (
    Option("Name", "string", ""),
    Option("CPU", "any", None, "CPUs of each instance"),
    Option("MaxPods", "integer", 0, "pods an instance holds (0: no limit)"),
    Option("Instances", "any", None, "instances of the type: N, 'N CPUs' or 'N %' of unreserved CPUs"),
    Option("FillOrder", "string", "Balanced", "Balanced (most room first) or Packed", choices=("Balanced", "Packed")),
    # The other documented spelling: resources: {cpu}, capacity: {pod}, typeResources: {cpu}.
    Option("Resources", "object", None, check=_quantity("cpu")),
    Option("Capacity", "object", None, check=_quantity("pod")),
    Option("TypeResources", "object", None, check=_quantity("cpu")),
)
POLICY_OPTIONS = (
    Option("PinCPU", "boolean", True),
    Option("PinMemory", "boolean", True),
    Option("ReservedPoolNamespaces", "strings", ["kube-system"]),
    Option("Pools", "objects", [], items=TYPE_OPTIONS),
    Option("PoolTypes", "objects", [], items=TYPE_OPTIONS),
)


@dataclass(eq=False)
class Instance:
    type: str
    index: int
    cpus: CPUSet
    max_pods: int = 0
    pods: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return f"{self.type}[{self.index}]"


class PodpoolsPolicy(Policy):
    name = "podpools"
    description = "all containers of an annotated pod in one pool instance of dedicated CPUs"
    options = POLICY_OPTIONS

    def __init__(self, config: Mapping[str, Any] | None = None, topology: Topology | None = None) -> None:
        super().__init__(config, topology)
        self.topo = self.require_topology()
        raw = self.read_options()
        self.pin_cpu, self.pin_memory = raw["PinCPU"], raw["PinMemory"]
        self.reserved_namespaces = reserved_namespaces(raw["ReservedPoolNamespaces"])
        cpus = cpuvalues.resolve_cpus(self.config, topology)
        self.reserved = cpus.reserved
        free = cpus.general - self.reserved
        self.instances: list[Instance] = []
        self.fill: dict[str, str] = {}
        types = []
        for i, doc in enumerate(raw["Pools"] + raw["PoolTypes"]):
            t = read(doc, TYPE_OPTIONS, f"policy.podpools.Pools[{i}]")
            where = f"policy.podpools.Pools[{i}] ({t['Name'] or 'no name'})"
            cpu = t["CPU"] if t["CPU"] is not None else t["Resources"]
            if not t["Name"] or cpu is None:
                raise PolicyError(f"{where}: Name and CPU are required")
            per = cpuvalues.parse(cpu, f"{where}.CPU")
            if isinstance(per, CPUSet) or per <= 0 or per % 1000:
                raise PolicyError(f"{where}.CPU: {cpu!r}: a whole number of CPUs")
            types.append((t, where, per // 1000))
        # The default pool's CPUs are set aside first, as cri-resmgr does: a type's `N %` is of the rest.
        default_cpus = next((per for t, _, per in types if t["Name"] == DEFAULT), None)
        if default_cpus is not None and default_cpus > len(free):
            raise PolicyError(f"policy.podpools: the default pool's {default_cpus} CPUs do not fit in "
                              f"{free or 'none'}")
        aside = default_cpus or 0
        unreserved = len(free) - aside
        for t, where, per in types:
            name = t["Name"]
            if name == DEFAULT:
                continue
            if name == RESERVED or name in self.fill:
                raise PolicyError(f"{where}: the name {name} is taken")
            instances = t["Instances"] if t["Instances"] is not None else t["TypeResources"]
            number, unit = _count(instances if instances is not None else 1, f"{where}.Instances")
            total = {"": number * per, "cpus": number, "%": number * unreserved / 100}[unit]
            count = int(total // per)
            if count * per > len(free) - aside:
                raise PolicyError(f"{where}: {count} instances of {per} CPUs need {count * per} CPUs; "
                                  f"{len(free) - aside} are left ({free or 'none'}"
                                  f"{f', {aside} of them set aside for the default pool' if aside else ''})")
            max_pods = t["MaxPods"] if t["MaxPods"] else (t["Capacity"] or 0)
            if not isinstance(max_pods, int) or max_pods < 0:
                raise PolicyError(f"{where}.MaxPods: {max_pods!r} is not a number of pods")
            self.fill[name] = t["FillOrder"]
            for n in range(count):
                got = take_cpus(topology, free, per)
                free -= got
                self.instances.append(Instance(name, n, got, max_pods))
        if default_cpus is not None:
            free = take_cpus(topology, free, default_cpus)
        self.default = free or self.reserved or cpus.general
        self.dra = PodpoolDevices(topology, self.instances)
        self.where: dict[str, str] = {}  # container key -> pool name
        self.pod_of: dict[str, str] = {}  # container key -> pod ID (for instances)
        self.orphans: dict[str, str] = {}  # container key -> the pool type it is annotated for and is not

    def _pool_cpus(self, name: str) -> CPUSet:
        if name == RESERVED:
            return self.reserved or self.default
        if name == DEFAULT:
            return self.default
        return next(i.cpus for i in self.instances if i.name == name)

    def _choose(self, container: Container, pod: Pod) -> str:
        """The pool's name; DEFAULT also for a type not configured (see _wanted)."""
        wanted = self._wanted(container, pod)
        if wanted is None:
            if in_namespaces(pod.namespace, self.reserved_namespaces):
                return RESERVED
            return DEFAULT
        mine = [i for i in self.instances if i.type == wanted]
        if not mine:
            return DEFAULT
        holding = next((i for i in mine if pod.id in i.pods), None)
        if holding is not None:
            return holding.name
        room = [i for i in mine if not self.dra.full(i)]
        if not room:
            raise PolicyError(f"pod {pod.namespace}/{pod.name}: every {wanted} pool is full "
                              f"({len(mine)} instances of {mine[0].max_pods} pods)")
        previous = CPUSet.parse_or_empty(container.previous)
        again = [i for i in room if previous & i.cpus]  # where it ran before (a restart, a node reboot)
        if again:
            return again[0].name
        packed = self.fill[wanted] == "Packed"
        return min(room, key=lambda i: ((1 if packed else -1) * (i.max_pods - len(i.pods) if i.max_pods
                                                                  else -len(i.pods)), i.index)).name

    @staticmethod
    def _wanted(container: Container, pod: Pod) -> str | None:
        """The pool type the pod is annotated for (None: none)."""
        for hint in ("pool.podpools", "pooltype.podpools"):
            found = annotations.hint(container, pod, hint)
            if found is not None:
                return str(found[1]).strip()
        return None

    def _resources(self, base: Resources, pool: str) -> Resources:
        cpus = self._pool_cpus(pool)
        out = base.with_cpus(str(cpus) if self.pin_cpu else base.cpuset_cpus)
        if self.pin_memory:
            nodes = CPUSet(n.id for n in self.topo.nodes.values() if n.cpus & cpus and n.memory)
            if nodes:
                out.cpuset_mems = str(nodes)
        return out

    def _on_claim(self, container: Container, pod: Pod) -> str | None:
        """The instance of the claim the container runs on (None: it uses no claim)."""
        claim = claims.claim_of(container, pod, self.dra.book.usable())
        if claim is None:
            return None
        i = self.dra.instance_of(claim.uid)
        wanted = self._wanted(container, pod)
        if wanted is not None and wanted != i.type:
            raise PolicyError(f"container {pod.namespace}/{pod.name}/{container.name}: its annotation names pool "
                              f"type {wanted}, but {claim.who} is on pool {i.name}")
        return i.name

    def allocate(self, container: Container, pod: Pod, view: View) -> Decision:
        req = container_requirements(container, pod)
        on_claim = self._on_claim(container, pod)
        pool = on_claim or self._choose(container, pod)
        self.release(container, view)
        if on_claim is not None:
            self.dra.users[container.key] = container.claims[0]
        self.where[container.key] = pool
        self.pod_of[container.key] = pod.id
        wanted = self._wanted(container, pod)
        if wanted is not None and all(i.type != wanted for i in self.instances):
            self.orphans[container.key] = wanted
        for i in self.instances:
            if i.name == pool:
                i.pods.add(pod.id)
        resources = self._resources(container.requested, pool)
        resources.cpu_shares = milli_to_shares(req.cpu_request)
        classes = class_names(container, pod)
        return Decision(resources=resources, classes=classes)

    def release(self, container: Container, view: View) -> Decision:
        """The container leaves its pool; an unprepared claim's place goes with its last user."""
        uid = self.dra.users.pop(container.key, None)
        if uid and self.dra.book.last_user_gone(uid, self.dra.claim_users(uid)):
            self.dra.book.drop(uid)
        self.orphans.pop(container.key, None)
        pool = self.where.pop(container.key, None)
        pod = self.pod_of.pop(container.key, None)
        if pool is not None and pod is not None and pod not in self.pod_of.values():
            for i in self.instances:
                i.pods.discard(pod)
        return Decision()

    def update(self, container: Container, requested: Resources, view: View) -> Decision:
        pool = self.where.get(container.key)
        return Decision() if pool is None else Decision(resources=self._resources(requested, pool))

    def rename(self, old_key: str, new_key: str) -> None:
        if old_key in self.dra.users:
            self.dra.users[new_key] = self.dra.users.pop(old_key)
        if old_key in self.where:
            self.where[new_key] = self.where.pop(old_key)
            self.pod_of[new_key] = self.pod_of.pop(old_key)
        if old_key in self.orphans:
            self.orphans[new_key] = self.orphans.pop(old_key)

    def fallback(self) -> list[str]:
        out = []
        for wanted in sorted(set(self.orphans.values())):
            count = sum(1 for x in self.orphans.values() if x == wanted)
            out.append(f"pool type {wanted} is not configured (types: {', '.join(self.fill) or 'none'}): "
                       f"{count} container(s) annotated for it run in the default pool")
        return out

    def describe_pools(self) -> list[dict[str, Any]]:
        pools = [(RESERVED, self._pool_cpus(RESERVED)), (DEFAULT, self.default)]
        pools += [(i.name, i.cpus) for i in self.instances]
        out = []
        for name, cpus in pools:
            users = [k for k, p in self.where.items() if p == name]
            inst = next((i for i in self.instances if i.name == name), None)
            out.append(pool_entry(self.topo, name, cpus, cpus, reserved=cpus & self.reserved, containers=len(users),
                                  pods=len(inst.pods) if inst else len({self.pod_of[k] for k in users}),
                                  max_pods=inst.max_pods if inst else 0))
        return out

    def describe_grant(self, key: str) -> dict[str, Any] | None:
        pool = self.where.get(key)
        if pool is None:
            return None
        return {"pool": pool, "exclusive": "", "shared_milli": 0, "kind": "reserved" if pool == RESERVED else "shared"}

    # -- DRA claims (docs/dra.md; podpool_devices.py) ----------------------------------------
    def devices(self) -> list[dict[str, Any]]:
        return self.dra.listed()

    def prepare_claim(self, claim: Claim, view: View) -> Decision:
        """Book a pod's place in the claim's instance."""
        if self.dra.book.is_new(claim):
            self.dra.hold(claim)
        return Decision()

    def unprepare_claim(self, uid: str, view: View) -> Decision:
        """Give the place back, or, while containers run on the claim, once the last one goes."""
        if self.dra.book.give_back_now(uid, self.dra.claim_users(uid)):
            self.dra.book.drop(uid)
        return Decision()

    def prepared_claims(self) -> dict[str, Claim]:
        return self.dra.book.usable()

    def describe_claim(self, uid: str) -> dict[str, Any] | None:
        if uid not in self.dra.book.claims:
            return None
        cpus = self.dra.instance_of(uid).cpus
        return self.dra.describe(uid, CPUSet(n.id for n in self.topo.nodes.values() if n.cpus & cpus and n.memory))

    def export_state(self) -> dict[str, Any]:
        return {"where": dict(sorted(self.where.items())), "pods": dict(sorted(self.pod_of.items())),
                **self.dra.export()}

    def restore_state(self, data: Mapping[str, Any]) -> None:
        where = {k: str(v) for k, v in (data.get("where") or {}).items() if not k.startswith("pending:")}
        pods = {k: str(v) for k, v in (data.get("pods") or {}).items() if k in where}
        names = {RESERVED, DEFAULT} | {i.name for i in self.instances}
        for key, pool in where.items():
            if pool not in names or key not in pods:
                raise PolicyError(f"persisted placement of {key} in pool {pool!r}, which does not exist now")
        held = {i.name: {pods[k] for k, p in where.items() if p == i.name} for i in self.instances}
        for i in self.instances:
            if i.max_pods and len(held[i.name]) > i.max_pods:
                raise PolicyError(f"pool {i.name} would hold {len(held[i.name])} pods, more than {i.max_pods}")
        self.dra.restore(data)
        for i in self.instances:
            i.pods = held[i.name]
        self.where, self.pod_of = where, pods

