"""What a persisted engine state must look like before it is trusted.

The state file is ours, but a crash, a full disk or a hand edit can leave anything in
it; a file that does not match this schema is moved aside and the state rebuilt from the
runtime (StateStore.load), never half-used.
"""

from __future__ import annotations

from typing import Any

from fastjsonschema import JsonSchemaValueException

from resmgr.model import Container, Pod

_STR = {"type": "string"}
_INT = {"type": "integer"}
_STR_MAP = {"type": "object", "additionalProperties": _STR}
_STR_LIST = {"type": "array", "items": _STR}

_RESOURCES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "cpu_period": _INT, "cpu_quota": _INT, "cpu_shares": _INT, "memory_limit_in_bytes": _INT,
        "oom_score_adj": _INT, "cpuset_cpus": _STR, "cpuset_mems": _STR, "memory_swap_limit_in_bytes": _INT,
        "hugepage_limits": {"type": "object", "additionalProperties": _INT}, "unified": _STR_MAP,
    },
}

_POD = {
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "uid", "name", "namespace", "state", "qos_class"],
    "properties": {
        "id": {"type": "string", "minLength": 1}, "uid": _STR, "name": _STR, "namespace": _STR,
        "state": {"enum": ["ready", "notready"]},
        "qos_class": {"enum": ["Guaranteed", "Burstable", "BestEffort"]},
        "cgroup_parent": _STR, "labels": _STR_MAP, "annotations": _STR_MAP, "runtime_handler": _STR, "seq": _INT,
        "attempt": _INT, "overhead": _RESOURCES, "resources": _RESOURCES,
    },
}

_CONTAINER = {
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "pod_id", "name", "state"],
    "properties": {
        "id": {"type": "string", "minLength": 1}, "pod_id": _STR, "name": _STR, "attempt": _INT,
        "state": {"enum": ["pending", "created", "running", "exited"]},
        "image": _STR, "command": _STR_LIST, "args": _STR_LIST, "labels": _STR_MAP, "annotations": _STR_MAP,
        "requested": _RESOURCES, "resources": _RESOURCES, "rdt_class": _STR, "blockio_class": _STR, "classes": _STR_MAP,
        "seq": _INT,
        "hints": {"type": "object", "additionalProperties": {"type": "array", "items": _INT}},
        "pending": {"type": "boolean"}, "env": _STR_MAP, "adjusted": _RESOURCES, "previous": _STR,
        "claims": _STR_LIST,
    },
}

_CLAIM = {
    "type": "object",
    "additionalProperties": False,
    "required": ["uid", "namespace", "name", "device"],
    "properties": {"uid": {"type": "string", "minLength": 1}, "namespace": _STR, "name": _STR, "device": _STR,
                   "cpus": _INT, "requests": _STR_LIST, "pool": _STR},
}

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["version", "pods", "containers"],
    "properties": {
        "version": {"enum": [1, 2]},
        "pods": {"type": "array", "items": _POD},
        "containers": {"type": "array", "items": _CONTAINER},
        "policy": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {"name": _STR, "data": {"type": "object"}, "config": {"type": "object"}},
        },
        "unallocated": _STR_LIST,
        "degraded": _STR_LIST,
        "previous": _STR_MAP,
        "vanished": {"type": "object", "additionalProperties": {"type": "number"}},  # version 2
        "claims": {"type": "array", "items": _CLAIM},
    },
}


class InvalidState(ValueError):
    pass


# A pod whose sandboxes vanished is remembered as the entry "<uid>/" of previous, whose value is
# when (seconds since the epoch). The file stays version 1, which 0.1.0 reads: it drops the entry
# as a pod it does not know. (Development versions wrote them as version 2's "vanished".)
# The CPUs kept for a vanished pod's container are the entry "<uid>/<name>/held" (a container's
# name has no slash): 0.1.0 takes it for the placement of a container that never comes.
HELD = "/held"


def with_vanished(previous: dict[str, str], vanished: dict[str, float],
                  awaited: dict[str, str] | None = None) -> dict[str, str]:
    return {**previous, **{f"{uid}/": repr(t) for uid, t in vanished.items()},
            **{identity + HELD: cpus for identity, cpus in (awaited or {}).items()}}


def split_vanished(previous: dict[str, str]) -> tuple[dict[str, str], dict[str, float], dict[str, str]]:
    """(placements, vanished pods, CPUs kept for their containers) of a state's previous."""
    placements, vanished, awaited = {}, {}, {}
    for key, value in previous.items():
        if key.endswith(HELD) and key.count("/") == 2:
            awaited[key[:-len(HELD)]] = value
            continue
        if not key.endswith("/"):
            placements[key] = value
            continue
        try:
            vanished[key[:-1]] = float(value)
        except ValueError:
            pass  # a hand edit: forgotten, as the pod would be after 15 minutes
    return placements, vanished, awaited


def _schema_problem(data: Any) -> str:
    """Where and how data breaks SCHEMA ("" where it does not). The validator generated from it
    (scripts/genschemas.py) decides cheaply; the generic one, loaded only for a state it refuses,
    names the problem and has the last word."""
    from resmgr.generated.schemas import statefile  # generated from SCHEMA: imported once it exists

    try:
        statefile.validate(data)
        return ""
    except JsonSchemaValueException:
        pass
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(SCHEMA).iter_errors(data))
    if error is None:
        return ""
    return f"{'/'.join(str(p) for p in error.absolute_path) or 'top level'}: {error.message[:200]}"


def check(data: Any) -> None:
    """InvalidState naming the first problem, if data is not a usable engine state."""
    problem = _schema_problem(data)
    if problem:
        raise InvalidState(problem)
    try:
        for p in data["pods"]:
            Pod.from_dict(p)
        for c in data["containers"]:
            Container.from_dict(c)
    except (KeyError, TypeError, ValueError) as err:
        raise InvalidState(str(err)) from None
