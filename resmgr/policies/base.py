"""The policy interface: pure decisions over the engine's state, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resmgr.model import Claim, Container, Decision, IrqPlan, Pod, Resources, SchedulingClass, View
from resmgr.policies.toolkit.errors import PolicyError
from resmgr.policies.toolkit.options import Option, read
from resmgr.requests import RequirementError, Requirements, class_names, requirements
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.model import Topology

__all__ = ["Decision", "View", "Policy", "PolicyError", "class_names", "container_requirements"]


def container_requirements(container: Container, pod: Pod) -> Requirements:
    """What the container asks for; PolicyError naming it when that cannot be read."""
    try:
        return requirements(container, pod)
    except RequirementError as err:
        raise PolicyError(f"container {pod.namespace}/{pod.name}/{container.name}: {err}") from None


class Policy:
    """Base class; subclasses override what they act on. Instances must be deterministic."""

    name: str = ""
    pins = True  # it decides containers' CPUs and memory nodes (the none policy does not)
    description: str = ""
    # The options of its configuration section `policy.<name>` (policies/toolkit/options.py):
    # read with options.read, and the section's JSON Schema is generated from them.
    options: tuple[Option, ...] = ()
    # Its shared containers run together on a pool's shared CPUs (topology-aware, static): see
    # shares_freely.
    shared_pools: bool = False

    def __init__(self, config: Mapping[str, Any] | None = None, topology: Topology | None = None) -> None:
        self.config = dict(config or {})
        self.topology = topology

    def require_topology(self) -> Topology:
        """The machine's topology; PolicyError for a policy that cannot work without it."""
        if self.topology is None:
            raise PolicyError(f"policy {self.name} needs the machine topology")
        return self.topology

    def read_options(self) -> dict[str, Any]:
        """The values of the policy's options from its section `policy.<name>` (PolicyError if bad)."""
        return read(self.config.get(self.name), self.options, f"policy.{self.name}")

    def rename(self, old_key: str, new_key: str) -> None:
        """A container's key changed (its runtime ID became known)."""

    def allocate(self, container: Container, pod: Pod, view: View) -> Decision:
        """Place a new container. container.previous, when set, names the CPUs the pod's container of
        that name ran on before (a restart, a node reboot): policies give them again where they are
        free and would be chosen for a request of that size."""
        return Decision()

    def adopt(self, container: Container, pod: Pod, view: View) -> Decision:
        """Allocate a container found running, whose resources say what it runs with now.

        Policies keep it where it runs when that is consistent with every other grant
        (a restart must not shuffle exclusive CPUs); the default allocates afresh.
        """
        return self.allocate(container, pod, view)

    def release(self, container: Container, view: View) -> Decision:
        return Decision()

    def update(self, container: Container, requested: Resources, view: View) -> Decision:
        return Decision()

    def resize(self, container: Container, pod: Pod, requested: Resources, view: View) -> Decision:
        """In-place resize: place the container again for its new request, keeping what it can.

        PolicyError: the new request cannot be met, and nothing changed. The default fits
        policies without grants of their own.
        """
        return self.update(container, requested, view)

    def rebalance(self, view: View) -> Decision:
        """Re-place containers for a better fit; updates name every container that moved."""
        return Decision()

    def reconfigure(self, config: Mapping[str, Any], view: View) -> Decision:
        """Take a new policy configuration keeping grants in place, or raise PolicyError and change nothing.

        NotImplementedError: the policy cannot keep its grants across a new configuration; the
        caller re-allocates every container under a new instance instead.
        """
        raise NotImplementedError

    # -- Dynamic Resource Allocation: devices a ResourceClaim can be allocated (docs/dra.md) ------
    def devices(self) -> list[dict[str, Any]]:
        """The DRA devices the policy offers, each: name (a DNS label), attributes (name -> int, str or
        bool), cpus (its capacity: the CPUs prepared claims hold on it plus those it can still give),
        and cpuset (its CPUs, for the operator). The published ResourceSlice is made from them."""
        return []

    def prepare_claim(self, claim: Claim, view: View) -> Decision:
        """Hold a claim's CPUs on its device (the decision's updates: containers that moved for it);
        PolicyError, nothing changed, when the device is unknown or cannot give them. Preparing a
        claim held already changes nothing."""
        raise PolicyError(f"{claim.who}: policy {self.name} offers no DRA devices")

    def prepared_claims(self) -> dict[str, Claim]:
        """The DRA claims kubelet prepared here and has not unprepared, by UID, as it asked for
        them. The policy's record is the only one: the engine persists these and prepares them
        again under another policy."""
        return {}

    def unprepare_claim(self, uid: str, view: View) -> Decision:
        """Give a claim's CPUs back (containers still using it keep running on them until they go)."""
        return Decision()

    def describe_claim(self, uid: str) -> dict[str, Any] | None:
        """What a prepared claim holds: device, cpus (CPU set text), mems, users (container keys)."""
        return None

    def describe_pools(self) -> list[dict[str, Any]]:
        """The policy's pools for simulate, introspection and metrics.

        Each: name, parent (""), CPU sets as text (cpus: all below the pool; shared: the pool's own
        shared CPUs now; reserved; isolated: free isolated ones), mems, memory (bytes by type),
        and the counts exclusive_grants, containers, shared_milli_requested, shared_milli_free
        (negative when overcommitted), shared_elsewhere (its shared containers that run on a parent
        pool's or the reserved CPUs because exclusive grants took all of its own).
        """
        return []

    def warm(self, key: str, view: View) -> Decision:
        """A cold start is over (Decision.warm_after): the container's memory as it normally is
        (in updates, by its key)."""
        return Decision()

    def cold(self) -> list[str]:
        """Containers whose cold start has not ended (after a restart the engine warms them)."""
        return []

    def irq_plan(self) -> IrqPlan:
        """Where interrupts go (the irq controller writes their affinity)."""
        return IrqPlan()

    def cpu_classes(self) -> dict[str, CPUSet]:
        """The CPUs each CPU class holds now (the cpu controller puts the class on them)."""
        return {}

    def scheduling_class(self, name: str) -> SchedulingClass | None:
        """A scheduling class the policy names for containers (Decision.classes["sched"]), or None."""
        return None

    def fallback(self) -> list[str]:
        """Conditions in which containers run somewhere other than they normally would (shared
        containers on the reserved CPUs because exclusive grants took every shared CPU), one line
        each; the engine logs each when it starts and when it ends."""
        return []

    def pool_of(self, key: str) -> str:
        """The pool a container runs in: "" if it holds nothing of the policy, "exclusive" for CPUs of
        its own outside any pool."""
        held = self.describe_grant(key)
        return "" if held is None else held.get("pool") or "exclusive"

    def describe_grant(self, key: str) -> dict[str, Any] | None:
        """What a container holds: pool, exclusive (CPU set text), shared_milli, kind
        (exclusive, shared, mixed or reserved), and fallback ("reserved" or "parent") when a shared
        one runs there for want of its pool's own shared CPUs; None when it holds nothing of the policy."""
        return None

    def shares_freely(self, key: str) -> bool:
        """Whether the container runs on CPUs that other containers share too (a shared pool), so
        that while moving it may run for a moment on CPUs another such container is still to leave:
        how a swap in which neither keeps a CPU gets done. Never an exclusive or a claim's container,
        nor a balloon's or pod pool's member, whose CPUs no other balloon or pool may touch."""
        if not self.shared_pools:
            return False
        held = self.describe_grant(key)
        return held is not None and held.get("kind") in ("shared", "reserved")

    def export_state(self) -> dict[str, Any]:
        """Opaque policy data persisted with the engine state."""
        return {}

    def restore_state(self, data: Mapping[str, Any]) -> None:
        pass


def kept(container: Container) -> tuple[CPUSet, CPUSet]:
    """The CPUs a container found running keeps where they would do, first to last: those it runs
    on, then those its pod's container of that name ran on (one made while cri-resmgr was away,
    on every CPU, after a reboot)."""
    return CPUSet.parse_or_empty(container.resources.cpuset_cpus), CPUSet.parse_or_empty(container.previous)
