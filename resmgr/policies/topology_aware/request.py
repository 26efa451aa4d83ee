"""What one container asks of topology-aware's pools, read from its requests, annotations and the
policy's options."""

from __future__ import annotations

from dataclasses import dataclass, field

from resmgr.model import Container, Pod, QOSClass
from resmgr.policies.base import PolicyError, View
from resmgr.policies.toolkit import annotations
from resmgr.policies.toolkit.allocator import ANY, Preferences, preferences
from resmgr.policies.toolkit.options import in_namespaces
from resmgr.policies.topology_aware.accounts import Accounts
from resmgr.policies.topology_aware.affinity import affinities
from resmgr.policies.topology_aware.tree import Pool
from resmgr.requests import Requirements
from resmgr.topology import interrupts
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import MemoryType, Topology

# nri-plugins' CPU topology levels, widest first (a pool's level: tree.Pool.level).
LEVELS = ("system", "package", "die", "numa")
UNLIMITED_BURSTABLE = "unlimited-burstable"


@dataclass(frozen=True)
class Settings:
    """The options that shape requests (see policy.OPTIONS)."""

    prefer_isolated: bool = True
    prefer_shared: bool = False
    colocate_pods: bool = False
    colocate_namespaces: bool = False
    unlimited_burstable: int = 1  # a LEVELS index
    reserved_namespaces: tuple[str, ...] = ()
    controllable_irqs: tuple[str, ...] = ()  # the interrupts irq-affinity may name (none: every one)


@dataclass
class Request:
    """What one container asks of a pool."""

    who: str
    exclusive: int = 0  # whole CPUs to hold exclusively
    shared: int = 0  # milli-CPU from the shared CPUs
    on_shared: bool = True
    reserved: bool = False
    isolated: bool = False  # exclusive CPUs preferably from the isolated ones
    memory: int = 0  # accounted
    memory_span: int = 0  # a Burstable container's memory limit, above what is accounted: pools that wide
    mem_types: frozenset[MemoryType] = annotations.DEFAULT_MEMORY
    explicit_types: bool = False  # asked for by annotation: pools having them all rank higher
    lift: int = 0  # pools above the best fit (prefer-shared-cpus: -N)
    hints: dict[str, list[int]] = field(default_factory=dict)  # device -> its NUMA nodes
    affinity: dict[str, float] = field(default_factory=dict)  # container key -> weight
    prefer: Preferences = ANY  # what kind of exclusive CPUs
    hide_ht: bool = False
    pin_cpu: bool = True  # False: cpu.preserve
    pin_memory: bool = True  # False: memory.preserve
    cold: float = 0.0  # cold-start seconds (its memory on PMEM first)
    irq_claim: tuple[str, ...] = ()  # interrupts its exclusive CPUs are to handle
    irq_mask: tuple[str, ...] = ()  # interrupts to keep off them
    irq_claim_first: bool = False  # its masks win over claims
    previous: CPUSet = EMPTY  # where the pod's container of this name ran before: its pool first
    burst_limit: int = 0  # a Burstable container's CPU limit (milli): pools with that many CPUs first
    burst_level: int | None = None  # a Burstable container without one: pools this wide or wider first

    def bursts_in(self, pool: Pool) -> bool:
        """Whether the pool is wide enough for what the container may burst to: CPUs enough for its
        limit (reserved ones counted, as nri-plugins counts them), or the level it may go to."""
        if self.burst_level is not None:
            return pool.level <= self.burst_level or pool.parent is None
        return 1000 * len(pool.cpus) >= self.burst_limit

    def describe(self) -> str:
        parts = []
        if self.reserved:
            parts.append("reserved CPUs")
        if self.exclusive:
            parts.append(f"{self.exclusive} exclusive CPU(s)" + (" (isolated preferred)" if self.isolated else ""))
        if self.on_shared and not self.reserved:
            parts.append(f"{self.shared}m shared CPU")
        if self.memory:
            parts.append(f"{self.memory >> 20} MiB of {'/'.join(sorted(self.mem_types))} memory")
        return ", ".join(parts)


class Asking:
    """Builds a container's Request."""

    def __init__(self, settings: Settings, accounts: Accounts, topology: Topology, reserved_pool: Pool | None,
                 memory_types_present: frozenset[MemoryType]) -> None:
        self.settings, self.accounts, self.topology = settings, accounts, topology
        self.reserved_pool, self.memory_types_present = reserved_pool, memory_types_present

    def request(self, container: Container, pod: Pod, req: Requirements, view: View) -> Request:
        who = f"{pod.namespace}/{pod.name}/{container.name}"
        types = annotations.memory_types(container, pod)
        if types is not None and self.memory_types_present and not types & self.memory_types_present:
            raise PolicyError(f"container {who}: asks for {'/'.join(sorted(types))} memory; this machine has "
                              f"{'/'.join(sorted(self.memory_types_present))}")
        # A Burstable container's memory is accounted by its request, where known (the webhook's
        # annotation), and its pool must be wide enough for its limit, as nri-plugins has it.
        by_request = req.qos == QOSClass.BURSTABLE and req.memory_request > 0
        r = Request(who, memory=req.memory_request if by_request else req.memory_limit or req.memory_request,
                    memory_span=req.memory_limit if by_request and req.memory_limit > req.memory_request else 0,
                    mem_types=types if types is not None else annotations.DEFAULT_MEMORY,
                    explicit_types=types is not None, hints=container.hints,
                    hide_ht=bool(annotations.hide_hyperthreads(container, pod)),
                    pin_cpu=not annotations.preserve(container, pod, "cpu"),
                    pin_memory=not annotations.preserve(container, pod, "memory"),
                    cold=annotations.cold_start(container, pod),
                    previous=CPUSet.parse_or_empty(container.previous))
        reserved_hint = annotations.bool_hint(container, pod, annotations.PREFER_RESERVED)
        in_reserved_namespace = in_namespaces(pod.namespace, self.settings.reserved_namespaces)
        if self.reserved_pool is not None and (
                reserved_hint or (reserved_hint is None and in_reserved_namespace)):
            grants = self.accounts.grants
            used = sum(g.milli for k, g in grants.items() if g.reserved and k != container.key)
            if used + req.cpu_request <= 1000 * len(self.accounts.reserved):
                r.reserved, r.on_shared, r.shared = True, False, req.cpu_request
                return r
            # More than the reserved CPUs have left: the whole machine's shared CPUs, as nri-plugins
            # places it, rather than overcommitting the reserved ones.
            r.shared, r.lift = req.cpu_request, len(self.accounts.pools)
            return r
        irqs = annotations.irq_affinity(container, pod)
        if irqs and req.qos != QOSClass.GUARANTEED:
            raise PolicyError(f"container {who}: invalid IRQ affinity, QoS class {req.qos.value} is not Guaranteed")
        r.affinity = self.affinity(container, pod, view)
        shared_hint, r.lift = annotations.prefer_shared(container, pod)
        all_shared = shared_hint if shared_hint is not None else self.settings.prefer_shared
        whole, fraction = req.whole_cpus, req.fraction
        # Only Guaranteed containers get exclusive CPUs; 2 CPUs or more only for whole CPUs,
        # unless the pod explicitly says prefer-shared-cpus: false.
        if (req.qos != QOSClass.GUARANTEED or whole == 0 or all_shared
                or (whole >= 2 and fraction and shared_hint is not False)):
            if irqs:
                raise PolicyError(f"container {who}: IRQ affinity is invalid without exclusive CPUs")
            r.shared = req.cpu_request
            if req.qos == QOSClass.BURSTABLE:
                if not req.cpu_limit:
                    r.burst_level = self.unlimited_level(container, pod)
                elif req.cpu_limit > req.cpu_request:
                    r.burst_limit = req.cpu_limit
            return r
        r.exclusive, r.shared, r.on_shared = whole, fraction, bool(fraction)
        if irqs:
            # What the patterns name of the machine's interrupts (nri-plugins checks it so too).
            problems = interrupts.denied(irqs.claim + irqs.mask, self.settings.controllable_irqs,
                                         self.topology.interrupts)
            if problems:
                raise PolicyError(f"container {who}: " + "; ".join(problems))
        r.irq_claim, r.irq_mask, r.irq_claim_first = irqs
        r.prefer = preferences(container, pod, self.topology, avoid=view.held)
        iso_hint = annotations.prefer_isolated(container, pod)
        r.isolated = iso_hint if iso_hint is not None else (self.settings.prefer_isolated and whole == 1)
        return r

    def unlimited_level(self, container: Container, pod: Pod) -> int:
        """The widest pool level for a Burstable container without a CPU limit: its annotation, or
        UnlimitedBurstable."""
        found = annotations.hint(container, pod, UNLIMITED_BURSTABLE)
        if found is None:
            return self.settings.unlimited_burstable
        key, value = found
        word = str(value).strip().lower()
        if word not in LEVELS:
            raise PolicyError(f"annotation {key} of container {container.name}: {value!r} is not one of "
                              f"{', '.join(LEVELS)}")
        return LEVELS.index(word)

    def affinity(self, container: Container, pod: Pod, view: View) -> dict[str, float]:
        """Weight towards each placed container (ColocatePods/Namespaces add 1 each)."""
        rules = affinities(container, pod)
        if not rules and not self.settings.colocate_pods and not self.settings.colocate_namespaces:
            return {}
        out: dict[str, float] = {}
        for key in self.accounts.grants:
            other = view.containers.get(key)
            if other is None or key == container.key:
                continue
            other_pod = view.pods.get(other.pod_id)
            weight = 0.0
            for a in rules:
                if a.in_scope(container, other, other_pod) and a.match(other, other_pod):
                    weight += a.weight
            if self.settings.colocate_pods and other.pod_id == container.pod_id:
                weight += 1
            if self.settings.colocate_namespaces and other_pod is not None and other_pod.namespace == pod.namespace:
                weight += 1
            if weight:
                out[key] = weight
        return out
