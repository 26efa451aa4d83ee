"""Container affinity and anti-affinity annotations.

The pod annotations `cri-resource-manager.intel.com/affinity` and `.../anti-affinity`
map a container name to a list of affinities, each `{scope, match, weight}` where scope
and match are expressions `{key, operator, values}`. The scope (default: the same pod)
bounds which containers are considered, the match picks those the weight applies to.
Weights default to 1; anti-affinities always push (negative weight). The shorthand
`name: [other, ...]` means a match on container names within the pod.

Expression keys: `name`, `namespace`, `qosclass`, `id`, `pod/name`, `pod/namespace`,
`pod/qosclass`, `labels/<key>`, `annotations/<key>`, `pod/labels/<key>`,
`pod/annotations/<key>`; any other key is a container label (kubelet's
`io.kubernetes.container.name` and `io.kubernetes.pod.*` labels resolve to the names).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from policies.base import PolicyError
from resmgr.model import Container, Pod

AFFINITY = "cri-resource-manager.intel.com/affinity"
ANTI_AFFINITY = "cri-resource-manager.intel.com/anti-affinity"

_OPERATORS: dict[str, Callable[[str | None, tuple[str, ...]], bool]] = {
    "Equals": lambda v, vals: v is not None and len(vals) == 1 and v == vals[0],
    "NotEqual": lambda v, vals: len(vals) == 1 and v != vals[0],
    "In": lambda v, vals: v is not None and v in vals,
    "NotIn": lambda v, vals: v not in vals,
    "Exists": lambda v, vals: v is not None,
    "NotExist": lambda v, vals: v is None,
    "AlwaysTrue": lambda v, vals: True,
    "Matches": lambda v, vals: v is not None and len(vals) == 1 and fnmatch.fnmatchcase(v, vals[0]),
    "MatchesNot": lambda v, vals: v is None or (len(vals) == 1 and not fnmatch.fnmatchcase(v, vals[0])),
    "MatchesAny": lambda v, vals: v is not None and any(fnmatch.fnmatchcase(v, p) for p in vals),
    "MatchesNone": lambda v, vals: v is None or not any(fnmatch.fnmatchcase(v, p) for p in vals),
}
_OPERATORS["NotExists"] = _OPERATORS["NotExist"]
_SINGLE = ("Equals", "NotEqual", "Matches", "MatchesNot")

_LABEL_ALIASES = {"io.kubernetes.container.name": "name", "io.kubernetes.pod.name": "pod/name",
                  "io.kubernetes.pod.namespace": "pod/namespace"}


def resolve(key: str, container: Container, pod: Pod | None) -> str | None:
    """The value of an expression key for a container (None: the key does not exist)."""
    key = key.removeprefix("labels/") if key.removeprefix("labels/") in _LABEL_ALIASES else key
    key = _LABEL_ALIASES.get(key, key)
    if key.startswith("pod/"):
        if pod is None:
            return None
        rest = key[len("pod/"):]
        simple = {"name": pod.name, "namespace": pod.namespace, "qosclass": pod.qos_class.value,
                  "id": pod.id, "uid": pod.uid}
        if rest in simple:
            return simple[rest]
        kind, _, name = rest.partition("/")
        source = {"labels": pod.labels, "annotations": pod.annotations}.get(kind)
        return source.get(name) if source is not None else None
    simple = {"name": container.name, "id": container.key,
              "namespace": pod.namespace if pod else None, "qosclass": pod.qos_class.value if pod else None}
    if key in simple:
        return simple[key]
    kind, _, name = key.partition("/")
    source = {"labels": container.labels, "annotations": container.annotations}.get(kind)
    if source is not None:
        return source.get(name)
    return container.labels.get(key)


@dataclass(frozen=True)
class Expression:
    key: str
    operator: str
    values: tuple[str, ...]

    def __call__(self, container: Container, pod: Pod | None) -> bool:
        return _OPERATORS[self.operator](resolve(self.key, container, pod), self.values)


@dataclass(frozen=True)
class Affinity:
    match: Expression
    weight: int
    scope: Expression | None = None  # None: containers of the same pod

    def in_scope(self, me: Container, other: Container, other_pod: Pod | None) -> bool:
        return other.pod_id == me.pod_id if self.scope is None else self.scope(other, other_pod)


def _expression(raw: Any, where: str) -> Expression:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{where}: expected {{key, operator, values}}")
    unknown = set(raw) - {"key", "operator", "values"}
    if unknown:
        raise PolicyError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    op = str(raw.get("operator", "In"))
    if op not in _OPERATORS:
        raise PolicyError(f"{where}: unknown operator {op!r} (known: {', '.join(sorted(_OPERATORS))})")
    values = raw.get("values") or []
    if not isinstance(values, list):
        raise PolicyError(f"{where}: values must be a list")
    if op != "AlwaysTrue" and not raw.get("key"):
        raise PolicyError(f"{where}: operator {op} needs a key")
    if op in _SINGLE and len(values) != 1:
        raise PolicyError(f"{where}: operator {op} takes exactly one value")
    return Expression(str(raw.get("key", "")), op, tuple(str(v) for v in values))


def _parse(text: str, annotation: str, sign: int) -> dict[str, list[Affinity]]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PolicyError(f"annotation {annotation}: not valid YAML ({err})") from None
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise PolicyError(f"annotation {annotation}: expected a mapping of container name to affinities")
    out: dict[str, list[Affinity]] = {}
    for name, items in doc.items():
        where = f"annotation {annotation}, container {name}"
        if not isinstance(items, list):
            raise PolicyError(f"{where}: expected a list")
        parsed = []
        for i, item in enumerate(items):
            if isinstance(item, str | int) and not isinstance(item, bool):  # shorthand: a container name
                parsed.append(Affinity(Expression("name", "In", (str(item),)), sign))
                continue
            if not isinstance(item, Mapping):
                raise PolicyError(f"{where}, item {i}: expected a container name or {{scope, match, weight}}")
            unknown = set(item) - {"scope", "match", "weight"}
            if unknown:
                raise PolicyError(f"{where}, item {i}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
            if "match" not in item:
                raise PolicyError(f"{where}, item {i}: match is required")
            weight = item.get("weight", 1)
            if isinstance(weight, bool) or not isinstance(weight, int):
                raise PolicyError(f"{where}, item {i}: weight must be an integer")
            scope = _expression(item["scope"], f"{where}, item {i}, scope") if item.get("scope") else None
            parsed.append(Affinity(_expression(item["match"], f"{where}, item {i}, match"),
                                   abs(weight) * sign if sign < 0 else weight, scope))
        out[str(name)] = parsed
    return out


def affinities(container: Container, pod: Pod) -> list[Affinity]:
    """The container's affinities and anti-affinities from its pod's annotations."""
    annotations = {**container.annotations, **pod.annotations}
    out: list[Affinity] = []
    for annotation, sign in ((AFFINITY, 1), (ANTI_AFFINITY, -1)):
        text = annotations.get(annotation)
        if text:
            out.extend(_parse(text, annotation, sign).get(container.name, []))
    return out
