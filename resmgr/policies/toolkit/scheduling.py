"""Scheduling classes, as nri-plugins configures them: the Linux scheduling policy, priority, nice
value and I/O priority a container's processes get.

A policy reads its `SchedulingClasses` and names each container's class (`Decision.classes`,
controller "sched"); the sched controller (resmgr/controllers/sched.py) puts it on the
container's threads in relay mode, and the NRI front end in the container's OCI spec, where the
runtime sets it before the container's process starts. Children inherit it either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resmgr.model import Container, Pod, SchedulingClass
from resmgr.policies.toolkit import annotations
from resmgr.policies.toolkit.errors import PolicyError
from resmgr.policies.toolkit.options import Option, read

POLICIES = ("none", "other", "fifo", "rr", "batch", "iso", "idle", "deadline")
IO_CLASSES = ("none", "rt", "be", "idle")
FLAGS = ("reset-on-fork", "reclaim", "dl-overrun", "keep-policy", "keep-params", "util-clamp-min", "util-clamp-max")
REALTIME = ("fifo", "rr")

OPTIONS = (
    Option("Name", "string", ""),
    Option("Policy", "string", "none", "the Linux scheduling policy (none: left as it is)", choices=POLICIES),
    Option("Priority", "any", None, "the real-time priority (fifo, rr: 1-99)"),
    Option("Flags", "strings", [], "scheduling flags", check=lambda v, w: _flags(v, w)),
    Option("Nice", "any", None, "the nice value (-20 to 19)"),
    Option("Runtime", "any", None, "deadline: runtime (microseconds)"),
    Option("Deadline", "any", None, "deadline: deadline (microseconds)"),
    Option("Period", "any", None, "deadline: period (microseconds)"),
    Option("IOClass", "string", "none", "the I/O scheduling class (none: left as it is)", choices=IO_CLASSES),
    Option("IOPriority", "any", None, "the I/O priority within the class (0-7)"),
)


def _flags(value: Any, where: str) -> list[str]:
    for flag in value:
        if str(flag).lower() not in FLAGS:
            raise PolicyError(f"{where}: {flag!r} is not one of {', '.join(FLAGS)}")
    return [str(f).lower() for f in value]


def _number(value: Any, where: str, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().lstrip("-").isdigit():
        raise PolicyError(f"{where}: {value!r} is not a whole number")
    number = int(value)
    if not low <= number <= high:
        raise PolicyError(f"{where}: {number} is not within {low} and {high}")
    return number


def parse(docs: Sequence[Mapping[str, Any]], where: str) -> dict[str, SchedulingClass]:
    """The classes by name (PolicyError naming the first problem)."""
    out: dict[str, SchedulingClass] = {}
    for i, doc in enumerate(docs):
        at = f"{where}[{i}]"
        o = read(doc, OPTIONS, at)
        name = o["Name"]
        if not name:
            raise PolicyError(f"{at}: Name is required")
        if name in out:
            raise PolicyError(f"{at}: the name {name} is taken")
        policy, io_class = o["Policy"].lower(), o["IOClass"].lower()
        priority = _number(o["Priority"], f"{at}.Priority", 0, 99)
        if policy in REALTIME and not priority:
            raise PolicyError(f"{at}: policy {policy} needs a Priority of 1 to 99")
        if policy not in REALTIME and priority:
            raise PolicyError(f"{at}: a Priority is only for the real-time policies (fifo, rr)")
        runtime, deadline, period = (_number(o[k], f"{at}.{k}", 0, 1 << 62) or 0
                                     for k in ("Runtime", "Deadline", "Period"))
        if policy == "deadline" and not (0 < runtime <= deadline <= (period or deadline)):
            raise PolicyError(f"{at}: policy deadline needs 0 < Runtime <= Deadline <= Period")
        if policy == "iso":
            raise PolicyError(f"{at}: policy iso is not in the mainline kernel")
        io_priority = _number(o["IOPriority"], f"{at}.IOPriority", 0, 7)
        if io_priority is not None and io_class == "none":
            raise PolicyError(f"{at}: an IOPriority needs an IOClass (rt, be or idle)")
        out[name] = SchedulingClass(name, policy, priority, _number(o["Nice"], f"{at}.Nice", -20, 19),
                                    tuple(o["Flags"]), runtime, deadline, period, io_class,
                                    io_priority if io_priority is not None or io_class == "none" else 4)
    return out


def named(classes: Mapping[str, SchedulingClass], name: str, where: str) -> str:
    """name, checked against classes ("" stays "")."""
    if name and name not in classes:
        raise PolicyError(f"{where}: scheduling class {name!r} is not in SchedulingClasses "
                          f"({', '.join(classes) or 'none'})")
    return name


QOS_CLASSES = ("guaranteed", "burstable", "besteffort")
ANNOTATION = "scheduling-class"  # in our domain or nri-plugins' (scheduling-class.resource-policy.nri.io)


@dataclass(frozen=True)
class Scheduling:
    """A policy's scheduling classes and who gets which: a container's annotation, else its
    namespace's class, else its pod's QoS class's (nri-plugins' order)."""

    classes: Mapping[str, SchedulingClass]
    namespaces: Mapping[str, str]
    qos: Mapping[str, str]

    @classmethod
    def read(cls, classes: Sequence[Mapping[str, Any]], namespaces: Mapping[str, Any] | None,
             qos: Mapping[str, Any] | None, where: str) -> Scheduling:
        known = parse(classes, f"{where}.SchedulingClasses")
        by_ns = {str(ns): named(known, str(name), f"{where}.NamespaceSchedulingClasses.{ns}")
                 for ns, name in (namespaces or {}).items()}
        by_qos = {}
        for key, name in (qos or {}).items():
            lowered = str(key).lower()
            if lowered not in QOS_CLASSES:
                raise PolicyError(f"{where}.PodQoSSchedulingClasses: {key!r} is not a QoS class "
                                  "(Guaranteed, Burstable, BestEffort)")
            by_qos[lowered] = named(known, str(name), f"{where}.PodQoSSchedulingClasses.{key}")
        return cls(known, by_ns, by_qos)

    def of(self, container: Container, pod: Pod) -> str:
        """The class name for a container ("": none); PolicyError for an annotation naming none."""
        found = annotations.hint(container, pod, ANNOTATION)
        if found is not None:
            return named(self.classes, str(found[1]).strip(), f"annotation {found[0]} of container {container.name}")
        return self.namespaces.get(pod.namespace) or self.qos.get(pod.qos_class.value.lower(), "")


NONE = Scheduling({}, {}, {})
