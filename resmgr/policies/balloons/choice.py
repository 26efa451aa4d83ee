"""Which balloon a container goes to: its type (annotation, namespaces, expressions), its group,
and among the balloons of that type the one ranked first, or a new one."""

from __future__ import annotations

from typing import Any

from resmgr.model import Container, ContainerState, Pod
from resmgr.policies.balloons.fleet import Fleet
from resmgr.policies.balloons.model import BALLOON, Balloon, Member, hint
from resmgr.policies.balloons.types import DEFAULT, RESERVED, BalloonType
from resmgr.policies.base import PolicyError, container_requirements
from resmgr.policies.toolkit import annotations
from resmgr.policies.toolkit.expressions import substitute
from resmgr.policies.toolkit.options import in_namespaces
from resmgr.requests import CLASS_ANNOTATIONS, class_names, effective_annotation
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import MemoryType


class Choice:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.settings = fleet.settings
        self.orphans: dict[str, str] = {}  # running containers annotated for a type the configuration dropped

    def type_of(self, container: Container, pod: Pod) -> BalloonType:
        named = hint(container, pod, BALLOON)
        self.orphans.pop(container.key, None)
        if named is not None:
            t = self.fleet.types.get(named.strip())
            if t is not None:
                return t
            if container.state in (ContainerState.PENDING, ContainerState.UNKNOWN):  # being created: a wrong name
                raise PolicyError(f"container {pod.namespace}/{pod.name}/{container.name}: balloon type {named!r} "
                                  f"does not exist (types: {', '.join(self.fleet.types)})")
            # A running one whose type a new configuration dropped: placed as if unannotated, and said so.
            self.orphans[container.key] = named.strip()
        if in_namespaces(pod.namespace, self.settings.reserved_namespaces):
            return self.fleet.types[RESERVED]
        for t in self.settings.types:
            if in_namespaces(pod.namespace, t.namespaces) or \
                    any(e(container, pod) for e in t.match):
                return t
        return self.fleet.types[DEFAULT]

    def choose(self, t: BalloonType, group: str, m: Member, previous: CPUSet = EMPTY) -> tuple[Balloon | None, int]:
        """The balloon for a new member and the size it then has (None: a new balloon of that size);
        first one on the CPUs the member ran on before (a restart, a node reboot), if any."""
        if t.on_reserved:
            return next(b for b in self.fleet.balloons if b.type is t), 0
        free_cpus = self.fleet.free(t)
        free, again = len(free_cpus), len(previous & free_cpus)
        options: list[tuple[tuple[Any, ...], Balloon | None, int]] = []
        for b in self.fleet.balloons:
            if b.type is not t or b.group != group:
                continue
            size = self.fleet.size(t, b.milli + m.milli, True)
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
        count = sum(1 for b in self.fleet.balloons if b.type is t)
        size = self.fleet.size(t, m.milli, True)
        if size is not None and (not t.max_balloons or count < t.max_balloons) and size <= free:
            sticky = 0 if previous and again >= size else 1
            options.append(((sticky, 1 if t.spread_pods and not t.prefer_new else 0, 1, 1 if t.per_namespace else 0,
                             1 if t.prefer_new and not group else 2, -(1000 * size - m.milli), 1 << 30), None, size))
        if not options:
            raise PolicyError(self.no_room(t, group, m))
        _, b, size = min(options, key=lambda o: o[0])
        return b, size

    def no_room(self, t: BalloonType, group: str, m: Member) -> str:
        mine = [b for b in self.fleet.balloons if b.type is t]
        why = f"MaxCPUs {t.max_cpus}" if t.max_cpus and -(-m.milli // 1000) > t.max_cpus else \
            f"{len(mine)} of MaxBalloons {t.max_balloons}" if t.max_balloons and len(mine) >= t.max_balloons else \
            f"{len(self.fleet.free(t))} free CPUs"
        held = ", ".join(f"{b.name} {len(b.cpus)} CPUs {b.milli}m" for b in mine) or "none"
        return (f"balloon type {t.name}{f' group {group!r}' if group else ''}: no balloon can take "
                f"{m.milli}m more ({why}; balloons: {held})")

    def member(self, container: Container, pod: Pod) -> Member:
        req = container_requirements(container, pod)
        hide = bool(annotations.hide_hyperthreads(container, pod))
        return Member(req.cpu_request, pod.id, pod.namespace, hide,
                      pin_cpu=not annotations.preserve(container, pod, "cpu"),
                      pin_memory=not annotations.preserve(container, pod, "memory"),
                      mem_types=self._memory_types(container, pod))

    def _memory_types(self, container: Container, pod: Pod) -> frozenset[MemoryType]:
        """The memory-type annotation, ours or nri-plugins' (`memory-type.resource-policy.nri.io`)."""
        return annotations.memory_types(container, pod) or frozenset()

    def group(self, t: BalloonType, container: Container, pod: Pod) -> str:
        return substitute(t.group_by, container, pod) if t.group_by else ""

    def classes(self, container: Container, pod: Pod, t: BalloonType) -> dict[str, str]:
        """The container's class annotations, else its type's classes, else its QoS class."""
        classes = class_names(container, pod)
        merged = annotations.merged(container, pod)
        for controller, named in t.classes.items():
            if named and controller in CLASS_ANNOTATIONS and \
                    effective_annotation(merged, CLASS_ANNOTATIONS[controller], container.name) is None:
                classes[controller] = named
        sched = self.settings.scheduling.of(container, pod) or t.classes.get("sched", "")
        if sched:
            classes["sched"] = sched
        return classes
