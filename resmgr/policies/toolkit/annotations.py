"""Policy hints from pod and container annotations.

Two forms are read. The current one, `<hint>.cri-resource-manager.intel.com`, is
scoped by suffix: `/container.<name>`, then `/pod`, then the bare key. The legacy
one, `cri-resource-manager.intel.com/<hint>`, holds either a value for the whole pod
or a JSON/YAML object with a value per container name. A malformed value is a
PolicyError naming the annotation and the container, never a crash.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple

import yaml

from resmgr.model import Container, Pod
from resmgr.policies.toolkit import grants
from resmgr.policies.toolkit.errors import PolicyError
from resmgr.requests import DOMAIN, effective_annotation
from resmgr.topology.model import CoreKind, MemoryType

NRI_DOMAIN = "resource-policy.nri.io"  # nri-plugins' hints: the same names in its own domain
NRI_LEGACY_DOMAIN = "nri-resmgr.intel.com"  # and in the one before it, which its tests still use
PREFER_ISOLATED = "prefer-isolated-cpus"
PREFER_SHARED = "prefer-shared-cpus"
PREFER_RESERVED = "prefer-reserved-cpus"
MEMORY_TYPE = "memory-type"
CORE_TYPE = "prefer-core-type"
HIDE_HYPERTHREADS = "hide-hyperthreads"

_TRUE = ("true", "yes", "1")
_FALSE = ("false", "no", "0")


def merged(container: Container, pod: Pod) -> dict[str, str]:
    return {**container.annotations, **pod.annotations}


# The hints a policy consulted while placing one container (see recording).
_ASKED: ContextVar[set[str] | None] = ContextVar("asked_hints", default=None)
# Read by the controllers, not by a policy.
_CONTROLLERS = frozenset({"rdtclass", "blockioclass"})


@contextmanager
def recording() -> Iterator[set[str]]:
    """The names of the hints read (through hint()) inside the block."""
    asked: set[str] = set()
    token = _ASKED.set(asked)
    try:
        yield asked
    finally:
        _ASKED.reset(token)


def unread(container: Container, pod: Pod, asked: set[str]) -> list[str]:
    """Hint annotations (ours or nri-plugins', for this container) that the policy did not consult
    when placing it: they have no effect on it, and the user should hear so."""
    out = []
    for key in merged(container, pod):
        base, _, scope = key.partition("/")
        if scope.startswith("container.") and scope != f"container.{container.name}":
            continue
        for domain in (DOMAIN, NRI_DOMAIN, NRI_LEGACY_DOMAIN):
            if base.endswith("." + domain):
                name = base[: -len(domain) - 1]
                if name not in asked and name not in _CONTROLLERS:
                    out.append(key)
                break
    return sorted(out)


def hint(container: Container, pod: Pod, name: str) -> tuple[str, object] | None:
    """(annotation key, raw value) of a hint for this container, or None when absent: ours first,
    then nri-plugins' (`<name>.resource-policy.nri.io`, then `<name>.nri-resmgr.intel.com`, scoped
    alike), then the legacy form."""
    asked = _ASKED.get()
    if asked is not None:
        asked.add(name)
    annotations = merged(container, pod)
    for domain in (DOMAIN, NRI_DOMAIN, NRI_LEGACY_DOMAIN):
        key = f"{name}.{domain}"
        value = effective_annotation(annotations, key, container.name)
        if value is not None:
            return key, value
    legacy = f"{DOMAIN}/{name}"
    if legacy not in annotations:
        return None
    raw = annotations[legacy]
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        if raw.lstrip().startswith("{") or ":" in raw:
            raise PolicyError(f"annotation {legacy}: not a valid object ({err})") from None
        return legacy, raw
    if not isinstance(doc, Mapping):
        return legacy, raw
    if container.name not in doc:
        return None
    return legacy, doc[container.name]


def to_bool(key: str, who: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise PolicyError(f"annotation {key} of container {who}: {value!r} is not true or false")


def bool_hint(container: Container, pod: Pod, name: str) -> bool | None:
    found = hint(container, pod, name)
    return None if found is None else to_bool(found[0], container.name, found[1])


def prefer_isolated(container: Container, pod: Pod) -> bool | None:
    """The prefer-isolated-cpus hint, or None when absent."""
    return bool_hint(container, pod, PREFER_ISOLATED)


def prefer_shared(container: Container, pod: Pod) -> tuple[bool | None, int]:
    """The prefer-shared-cpus hint and how many levels above the best pool to place.

    A negative integer means shared CPUs, |n| pools further up the tree than the best fit.
    """
    found = hint(container, pod, PREFER_SHARED)
    if found is None:
        return None, 0
    key, value = found
    number = None
    if not isinstance(value, bool):
        try:
            number = int(str(value).strip())
        except ValueError:
            pass
    if number is not None:
        if number > 0:
            raise PolicyError(f"annotation {key} of container {container.name}: {value!r}: a number must be "
                              "0 or negative (shared CPUs, that many pools above the best fit)")
        return True, -number
    return to_bool(key, container.name, value), 0


DEFAULT_MEMORY = grants.DEFAULT_MEMORY  # DRAM and PMEM; HBM only on request
ALL_MEMORY = frozenset(MemoryType)


def memory_types(container: Container, pod: Pod) -> frozenset[MemoryType] | None:
    """The memory-type hint (dram, pmem, hbm, mixed; comma-separated), or None when absent."""
    found = hint(container, pod, MEMORY_TYPE)
    if found is None:
        return None
    key, value = found
    types: set[MemoryType] = set()
    for word in (w.strip().lower() for w in str(value).split(",")):
        if word == "mixed":
            types |= ALL_MEMORY
        elif word in (t.value for t in MemoryType):
            types.add(MemoryType(word))
        elif word:
            raise PolicyError(f"annotation {key} of container {container.name}: unknown memory type {word!r} "
                              "(use dram, pmem, hbm or mixed)")
    if not types:
        raise PolicyError(f"annotation {key} of container {container.name}: no memory type given")
    return frozenset(types)


def core_kind(container: Container, pod: Pod) -> CoreKind | None:
    """The prefer-core-type hint (performance or efficient), or None when absent."""
    found = hint(container, pod, CORE_TYPE)
    if found is None:
        return None
    key, value = found
    word = str(value).strip().lower()
    if word not in (CoreKind.PERFORMANCE, CoreKind.EFFICIENT):
        raise PolicyError(f"annotation {key} of container {container.name}: {value!r} is not performance or "
                          "efficient")
    return CoreKind(word)


def preserve(container: Container, pod: Pod, what: str) -> bool:
    """The `cpu.preserve` / `memory.preserve` hint (nri-plugins'): the container's CPUs or memory
    nodes are left as they are, not written, though its grant still counts."""
    return bool(bool_hint(container, pod, f"{what}.preserve"))


def hide_hyperthreads(container: Container, pod: Pod) -> bool | None:
    """The hide-hyperthreads hint: run on one thread of each core of the grant."""
    return bool_hint(container, pod, HIDE_HYPERTHREADS)


COLD_START = "cold-start"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def duration(text: str, where: str) -> float:
    """Seconds of a Go-style duration (`60s`, `1m30s`, `500ms`)."""
    text = text.strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise PolicyError(f"{where}: {text!r} is not a duration like 60s or 1m30s")
    return sum(float(n) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[u] for n, u in parts)


def _object_hint(container: Container, pod: Pod, name: str, what: str) -> tuple[str, Any] | None:
    """(where, document) of a hint whose value is a YAML object; None when absent."""
    found = hint(container, pod, name)
    if found is None:
        return None
    key, value = found
    where = f"{what}annotation {key} of container {container.name}"
    try:
        return where, yaml.safe_load(value) if isinstance(value, str) else value
    except yaml.YAMLError as err:
        raise PolicyError(f"{where}: not valid YAML: {err}") from None


def cold_start(container: Container, pod: Pod) -> float:
    """The cold-start hint's duration in seconds (0: none): `duration: 60s`."""
    found = _object_hint(container, pod, COLD_START, "")
    if found is None:
        return 0.0
    where, doc = found
    if not isinstance(doc, dict) or "duration" not in doc:
        raise PolicyError(f"{where}: expected duration: <time>, e.g. duration: 60s")
    return duration(str(doc["duration"]), where)

IRQ_AFFINITY = "irq-affinity"


class IrqAffinity(NamedTuple):
    claim: tuple[str, ...] = ()  # interrupts (numbers or globs) the exclusive CPUs handle
    mask: tuple[str, ...] = ()  # interrupts kept off them
    claim_first: bool = False  # mode claim-first: its masks win over claims (mask-first: claims win)

    def __bool__(self) -> bool:
        return bool(self.claim or self.mask)


IRQ_MODES = {"": False, "mask-first": False, "claim-first": True}


def irq_affinity(container: Container, pod: Pod) -> IrqAffinity:
    """The irq-affinity hint: the interrupts (numbers, or globs over /proc/interrupts' description)
    the container's exclusive CPUs claim, those kept off them, and the mode (`claim: [...]`,
    `mask: [...]`, `mode: mask-first|claim-first`); empty when absent."""
    found = _object_hint(container, pod, IRQ_AFFINITY, "invalid IRQ affinity in ")
    if found is None:
        return IrqAffinity()
    where, doc = found
    if not isinstance(doc, dict) or set(doc) - {"claim", "mask", "mode"}:
        raise PolicyError(f"{where}: expected claim: [globs], mask: [globs] and/or mode: mask-first|claim-first")
    out = []
    for field in ("claim", "mask"):
        globs = doc.get(field) or []
        if not isinstance(globs, list) or not all(isinstance(g, str | int) for g in globs):
            raise PolicyError(f"{where}: {field} is a list of interrupt numbers or globs, e.g. [\"*ttyS0*\"]")
        out.append(tuple(str(g) for g in globs))
    mode = doc.get("mode") or ""
    if mode not in IRQ_MODES:
        raise PolicyError(f"{where}: invalid IRQ affinity mode {mode!r} (valid modes: mask-first, claim-first)")
    return IrqAffinity(out[0], out[1], IRQ_MODES[mode])
