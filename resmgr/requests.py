"""What a container asks for: annotation keys, and requests estimated from resources or annotations.

kubelet turns a pod spec into cgroup knobs: CPU shares from the request, CFS quota from
the limit, a memory limit. Those are read back here; the webhook annotation
`intel.com/resources` (the pod spec's own requests and limits) wins when present.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from resmgr.model import Container, Pod, QOSClass

MIN_SHARES = 2
MAX_SHARES = 262144
SHARES_PER_CPU = 1024
QUOTA_PERIOD = 100000
MIN_QUOTA_PERIOD = 1000

# Annotation keys read by policies and controllers alike.
RESOURCES_ANNOTATION = "intel.com/resources"
DOMAIN = "cri-resource-manager.intel.com"
RDT_ANNOTATION = f"rdtclass.{DOMAIN}"
BLOCKIO_ANNOTATION = f"blockioclass.{DOMAIN}"


class RequirementError(ValueError):
    pass


@dataclass(frozen=True)
class Requirements:
    qos: QOSClass
    cpu_request: int  # milli-CPU
    cpu_limit: int  # milli-CPU, 0: none
    memory_request: int  # bytes
    memory_limit: int  # bytes, 0: none

    @property
    def whole_cpus(self) -> int:
        return self.cpu_request // 1000

    @property
    def fraction(self) -> int:
        return self.cpu_request % 1000


def shares_to_milli(shares: int) -> int:
    if shares <= MIN_SHARES:
        return 0
    return round(shares * 1000 / SHARES_PER_CPU)


def milli_to_shares(milli: int) -> int:
    if milli <= 0:
        return MIN_SHARES
    return max(MIN_SHARES, min(MAX_SHARES, round(milli * SHARES_PER_CPU / 1000)))


def quota_to_milli(quota: int, period: int) -> int:
    if quota <= 0 or period <= 0:
        return 0
    return round(quota * 1000 / period)


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
_FACTOR = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}


def parse_cpu(value: object) -> int:
    """A Kubernetes CPU quantity ('500m', '2', 1.5) in milli-CPU."""
    if isinstance(value, bool):
        raise RequirementError(f"bad CPU quantity {value!r}")
    if isinstance(value, int | float):
        return round(value * 1000)
    m = _QUANTITY.match(str(value).strip())
    if not m or m.group(2) not in (None, "m"):
        raise RequirementError(f"bad CPU quantity {value!r} (use e.g. 500m or 2)")
    number = float(m.group(1))
    return round(number) if m.group(2) == "m" else round(number * 1000)


def parse_memory(value: object) -> int:
    """A Kubernetes memory quantity ('512Mi', '1G', 1048576) in bytes."""
    if isinstance(value, bool):
        raise RequirementError(f"bad memory quantity {value!r}")
    if isinstance(value, int | float):
        return int(value)
    m = _QUANTITY.match(str(value).strip())
    if not m or m.group(2) == "m":
        raise RequirementError(f"bad memory quantity {value!r} (use e.g. 512Mi or 1G)")
    return int(float(m.group(1)) * _FACTOR[m.group(2)])


def effective_annotation(annotations: Mapping[str, str], key: str, container: str) -> str | None:
    """Look a key up for a container: `key/container.<name>`, then `key/pod`, then `key`."""
    for candidate in (f"{key}/container.{container}", f"{key}/pod", key):
        if candidate in annotations:
            return annotations[candidate]
    return None


def _from_annotation(pod: Pod, container: Container) -> tuple[dict, dict] | None:
    raw = pod.annotations.get(RESOURCES_ANNOTATION) or container.annotations.get(RESOURCES_ANNOTATION)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise RequirementError(f"annotation {RESOURCES_ANNOTATION} is not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise RequirementError(f"annotation {RESOURCES_ANNOTATION}: expected a JSON object")
    entry = doc.get(container.name, doc if ("requests" in doc or "limits" in doc) else None)
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise RequirementError(f"annotation {RESOURCES_ANNOTATION}: entry for {container.name} is not an object")
    return dict(entry.get("requests") or {}), dict(entry.get("limits") or {})


def requirements(container: Container, pod: Pod) -> Requirements:
    qos = pod.qos_class
    annotated = _from_annotation(pod, container)
    if annotated is not None:
        requests, limits = annotated
        cpu_limit = parse_cpu(limits["cpu"]) if "cpu" in limits else 0
        cpu_request = parse_cpu(requests["cpu"]) if "cpu" in requests else cpu_limit
        mem_limit = parse_memory(limits["memory"]) if "memory" in limits else 0
        mem_request = parse_memory(requests["memory"]) if "memory" in requests else mem_limit
        return Requirements(qos, cpu_request, cpu_limit, mem_request, mem_limit)
    res = container.requested
    cpu_request = shares_to_milli(res.cpu_shares)
    cpu_limit = quota_to_milli(res.cpu_quota, res.cpu_period or QUOTA_PERIOD)
    mem_limit = max(res.memory_limit_in_bytes, 0)
    mem_request = 0
    if qos == QOSClass.GUARANTEED:
        cpu_limit = cpu_request
        mem_request = mem_limit
    return Requirements(qos, cpu_request, cpu_limit, mem_request, mem_limit)


# The annotation naming a container's class, by controller name.
CLASS_ANNOTATIONS = {"rdt": RDT_ANNOTATION, "blockio": BLOCKIO_ANNOTATION}


def class_names(container: Container, pod: Pod) -> dict[str, str]:
    """The container's class for each controller: its annotation, else the pod's QoS class name."""
    annotations = {**container.annotations, **pod.annotations}
    qos = pod.qos_class.value
    return {controller: effective_annotation(annotations, key, container.name) or qos
            for controller, key in CLASS_ANNOTATIONS.items()}
