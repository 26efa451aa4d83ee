"""The engine's view of pods and containers, independent of any wire protocol."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from resmgr.topology.cpuset import CPUSet


class QOSClass(StrEnum):
    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BEST_EFFORT = "BestEffort"


def qos_class_from_cgroup_parent(cgroup_parent: str, cgroup_root: str = "") -> QOSClass:
    """Derive the pod QoS class from kubelet's cgroup layout.

    cgroupfs: /kubepods/burstable/pod<uid>, systemd: kubepods-burstable-pod<uid>.slice
    (possibly nested under kubepods.slice/kubepods-burstable.slice/). Guaranteed pods sit
    directly under kubepods.
    """
    path = cgroup_parent or ""
    if cgroup_root and path.startswith(cgroup_root):
        path = path[len(cgroup_root):]
    parts = [p for p in path.split("/") if p]
    # Skip up to and including the kubepods component.
    for i, part in enumerate(parts):
        if part in ("kubepods", "kubepods.slice"):
            parts = parts[i + 1:]
            break
    if not parts:
        # No kubepods component: a systemd slice name carries the whole path.
        if "kubepods" not in path:
            return QOSClass.BEST_EFFORT
        parts = [path.rsplit("/", 1)[-1]]
    first = parts[0].lower()
    if "besteffort" in first:
        return QOSClass.BEST_EFFORT
    if "burstable" in first:
        return QOSClass.BURSTABLE
    if "pod" in first:
        return QOSClass.GUARANTEED
    return QOSClass.BEST_EFFORT


def _plain(value: Any) -> Any:
    """A field's value for a snapshot: containers copied (the snapshot is written from another
    thread), everything else as it is. dataclasses.asdict does the same, many times slower, and
    a snapshot is taken at every lifecycle event."""
    if isinstance(value, dict):
        return {k: list(v) if isinstance(v, list) else v for k, v in value.items()}
    if isinstance(value, list):
        return list(value)
    return value


@functools.cache
def _collections(cls: type) -> tuple[str, ...]:
    """The fields of a dataclass that hold lists or dicts (those a snapshot copies)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.default_factory in (list, dict))


def _fields(obj: Any, skip_empty: bool = False) -> dict[str, Any]:
    """obj's fields for a snapshot (_plain), copying only those that can hold lists or dicts."""
    d = {k: v for k, v in obj.__dict__.items() if v} if skip_empty else dict(obj.__dict__)
    for name in _collections(type(obj)):
        if name in d:
            d[name] = _plain(d[name])
    return d


@dataclass
class Resources:
    """A container's Linux resources as plain data (0 / "" mean: not specified)."""

    cpu_period: int = 0
    cpu_quota: int = 0
    cpu_shares: int = 0
    memory_limit_in_bytes: int = 0
    oom_score_adj: int = 0
    cpuset_cpus: str = ""
    cpuset_mems: str = ""
    memory_swap_limit_in_bytes: int = 0
    hugepage_limits: dict[str, int] = field(default_factory=dict)
    unified: dict[str, str] = field(default_factory=dict)

    def cpu(self) -> tuple[int, int, int]:
        """The CPU request and limit as the runtime gets them: shares, quota, period."""
        return self.cpu_shares, self.cpu_quota, self.cpu_period

    def merged(self, newer: Resources) -> Resources:
        """These values with every field newer specifies (non-zero, non-empty) taken from newer."""
        out = dataclasses.replace(self)
        for f in dataclasses.fields(self):
            value = getattr(newer, f.name)
            if value:
                setattr(out, f.name, value)
        return out

    def overlaid(self, over: Resources | None) -> Resources:
        """These values with every field over sets laid on top; unified and hugepage limits merge by key."""
        if over is None:
            return self
        out = self.merged(over)
        if over.unified and self.unified:
            out.unified = {**self.unified, **over.unified}
        if over.hugepage_limits and self.hugepage_limits:
            out.hugepage_limits = {**self.hugepage_limits, **over.hugepage_limits}
        return out

    def without(self, names: set[str]) -> Resources | None:
        """These values with the named fields unset (None when nothing is left set)."""
        out = dataclasses.replace(self, **{n: type(getattr(self, n))() for n in names})
        return out if out.to_dict() else None

    def differing(self, other: Resources) -> set[str]:
        """The fields whose values differ."""
        return {f.name for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(other, f.name)}

    def with_cpus(self, cpuset_cpus: str) -> Resources:
        """A copy with another cpuset (cheaper than dataclasses.replace, used per shared container)."""
        out = object.__new__(Resources)
        out.__dict__.update(self.__dict__)
        out.cpuset_cpus = cpuset_cpus
        return out

    def to_dict(self) -> dict[str, Any]:
        return _fields(self, skip_empty=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Resources:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def overlay(base: Resources | None, over: Resources | None) -> Resources | None:
    """Fields set by over laid on base, either of which may be absent."""
    return base.overlaid(over) if base is not None else over


class PodState(StrEnum):
    READY = "ready"
    NOT_READY = "notready"


class ContainerState(StrEnum):
    PENDING = "pending"  # create in flight, no runtime ID yet
    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"  # the runtime lists it in no state we know (never persisted)

    @property
    def live(self) -> bool:
        """Created or running: it holds (or will hold) what it was granted."""
        return self in (ContainerState.CREATED, ContainerState.RUNNING)


class Stopped(Exception):
    """An update the runtime cannot apply because the container's processes have stopped (its
    record may say running while it ends them): nothing of it runs on the CPUs it would leave."""


class ContainerEvent(StrEnum):
    """What a runtime reports happened to a container, in any front end's terms."""

    CREATED = "created"
    STARTED = "started"
    STOPPED = "stopped"
    DELETED = "deleted"


@dataclass
class Pod:
    id: str
    uid: str
    name: str
    namespace: str
    state: PodState = PodState.READY
    qos_class: QOSClass = QOSClass.BEST_EFFORT
    cgroup_parent: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    runtime_handler: str = ""
    seq: int = 0  # insertion order; reconciliation uses it to spot fresh entries
    attempt: int = 0
    # The sandbox's own overhead and the sum of its containers' resources, as the runtime got them.
    overhead: Resources = field(default_factory=Resources)
    resources: Resources = field(default_factory=Resources)

    def to_dict(self) -> dict[str, Any]:
        d = _fields(self)
        d["state"], d["qos_class"] = self.state.value, self.qos_class.value
        d["overhead"], d["resources"] = self.overhead.to_dict(), self.resources.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Pod:
        d = dict(d)
        d["state"], d["qos_class"] = PodState(d["state"]), QOSClass(d["qos_class"])
        d["overhead"] = Resources.from_dict(d.get("overhead", {}))
        d["resources"] = Resources.from_dict(d.get("resources", {}))
        if d.get("adjusted") is not None:
            d["adjusted"] = Resources.from_dict(d["adjusted"])
        return cls(**d)


@dataclass
class Container:
    id: str  # runtime ID; "" while pending
    pod_id: str
    name: str
    attempt: int = 0
    state: ContainerState = ContainerState.PENDING
    image: str = ""
    command: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    # What kubelet asked for and what was actually applied after policy decisions.
    requested: Resources = field(default_factory=Resources)
    resources: Resources = field(default_factory=Resources)
    classes: dict[str, str] = field(default_factory=dict)  # class name by controller name ("rdt", "blockio")
    seq: int = 0
    # Topology hints: device host path -> the NUMA nodes it is attached to.
    hints: dict[str, list[int]] = field(default_factory=dict)
    # `resources` not yet confirmed by the runtime: pushed again until it is.
    pending: bool = False
    env: dict[str, str] = field(default_factory=dict)
    # Fields the runtime hook plugins set, laid over whatever the policy decides later.
    adjusted: Resources | None = None
    # The CPUs the pod's container of this name ran on last (an earlier attempt, or itself before a
    # node reboot): policies give them again when they are free and fit, as kubelet's CPU manager
    # keeps CPUs by pod UID and container name. "": none known.
    previous: str = ""
    # The DRA claims it uses (their UIDs, from the CDI devices kubelet passed): its CPUs are theirs.
    claims: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """Stable key: the runtime ID once known, else pod and name."""
        return self.id or f"pending:{self.pod_id}:{self.name}:{self.attempt}"

    def to_dict(self) -> dict[str, Any]:
        d = _fields(self)
        d["state"] = self.state.value
        d["requested"], d["resources"] = self.requested.to_dict(), self.resources.to_dict()
        if self.adjusted is None:
            del d["adjusted"]
        else:
            d["adjusted"] = self.adjusted.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Container:
        d = dict(d)
        d["state"] = ContainerState(d["state"])
        classes = d.setdefault("classes", {})
        for controller in ("rdt", "blockio"):  # the state file's older form
            old = d.pop(f"{controller}_class", "")
            if old and controller not in classes:
                classes[controller] = old
        d["requested"] = Resources.from_dict(d.get("requested", {}))
        d["resources"] = Resources.from_dict(d.get("resources", {}))
        if d.get("adjusted") is not None:
            d["adjusted"] = Resources.from_dict(d["adjusted"])
        return cls(**d)


@dataclass
class Claim:
    """A DRA ResourceClaim prepared on this node: the device of ours it was allocated and how many
    CPUs of it (0: the whole device, the claim named no amount)."""

    uid: str
    namespace: str
    name: str
    device: str
    cpus: int = 0
    requests: list[str] = field(default_factory=list)  # the claim's requests the device serves
    pool: str = ""  # the device's pool (the agent publishes one per node, named after it)

    @property
    def who(self) -> str:
        return f"claim {self.namespace}/{self.name}"

    def to_dict(self) -> dict[str, Any]:
        return _fields(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Claim:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Decision:
    """What a policy decided for one lifecycle event.

    `resources` replaces the container's resources (None: leave the request as is);
    `updates` holds every *other* container whose resources changed, by container key.
    `classes` names the container's class by controller name; a controller it does not
    name (or names with "") leaves the container's class as it was. `warm_after`: a cold start,
    after which the engine asks the policy to `warm` the container.
    """

    resources: Resources | None = None
    classes: dict[str, str] = field(default_factory=dict)
    updates: dict[str, Resources] = field(default_factory=dict)
    warm_after: float = 0.0  # cold start: seconds after which the engine asks the policy to warm it


@dataclass
class Adjustment:
    """What runtime hook plugins change in a pod's or a container's request (empty: nothing).

    Labels, annotations and environment variables are set (merged over the request's);
    `resources` holds only the fields to replace; a cgroup parent, when set, replaces the pod's.
    """

    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    resources: Resources | None = None
    cgroup_parent: str = ""

    def __bool__(self) -> bool:
        return bool(self.labels or self.annotations or self.env or self.resources or self.cgroup_parent)

    def then(self, later: Adjustment) -> Adjustment:
        """This adjustment followed by a later one (the later wins where both set a field)."""
        return Adjustment({**self.labels, **later.labels}, {**self.annotations, **later.annotations},
                          {**self.env, **later.env}, overlay(self.resources, later.resources),
                          later.cgroup_parent or self.cgroup_parent)


class View:
    """Read-only view of the pods and containers, handed to a policy.

    held: CPUs kept for containers the runtime lost with their pod's sandbox (a node reboot) until
    kubelet makes them again; a policy gives them to another container only where nothing else will do.
    """

    __slots__ = ("pods", "containers", "held")

    def __init__(self, pods: Mapping[str, Pod], containers: Mapping[str, Container],
                 held: CPUSet | None = None) -> None:
        self.pods: Mapping[str, Pod] = MappingProxyType(pods) if isinstance(pods, dict) else pods
        self.containers: Mapping[str, Container] = \
            MappingProxyType(containers) if isinstance(containers, dict) else containers
        self.held: CPUSet = held if held is not None else CPUSet()


@dataclass(frozen=True)
class SchedulingClass:
    """A scheduling class (nri-plugins'): the Linux scheduling policy, priority, nice value and I/O
    priority a container's threads get (policies name them; resmgr/policies/toolkit/scheduling.py)."""

    name: str
    policy: str = "none"  # none, other, fifo, rr, batch, idle or deadline; none: left as it is
    priority: int | None = None
    nice: int | None = None
    flags: tuple[str, ...] = ()
    runtime: int = 0  # deadline parameters, in microseconds
    deadline: int = 0
    period: int = 0
    io_class: str = "none"  # none, rt, be or idle; none: the I/O priority is left as it is
    io_priority: int | None = None

    @property
    def changes_scheduling(self) -> bool:
        return self.policy != "none" or self.nice is not None

    @property
    def changes_io(self) -> bool:
        return self.io_class != "none"


@dataclass(frozen=True)
class IrqPlan:
    """Where interrupts go, as a policy says it (the irq controller writes /proc/irq): those
    matching claims to the union of the claims' CPUs; the others to the sink CPUs where there are
    any, else off the isolated CPUs, else left as they were; an unclaimed interrupt matching a mask
    is kept off the mask's CPUs too, and any interrupt matching a late mask (irq-affinity mode
    claim-first) off its CPUs, claimed or not. A pattern is an interrupt's number or a shell glob
    over /proc/interrupts' description of it ("IO-APIC 8-edge rtc0": `*rtc0*`)."""

    claims: tuple[tuple[tuple[str, ...], CPUSet], ...] = ()
    masks: tuple[tuple[tuple[str, ...], CPUSet], ...] = ()  # CPUs kept off the unclaimed interrupts matching
    sink: CPUSet = field(default_factory=CPUSet)
    isolate: CPUSet = field(default_factory=CPUSet)
    controllable: tuple[str, ...] = ()  # only interrupts matching these may be touched (none: every one)
    late_masks: tuple[tuple[tuple[str, ...], CPUSet], ...] = ()  # CPUs kept off the interrupts matching, claimed too

    @property
    def empty(self) -> bool:
        return not (self.claims or self.masks or self.sink or self.isolate or self.late_masks)
