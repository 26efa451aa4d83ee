"""Container match expressions `{key, operator, values}`, shared by the policies.

Keys: `name`, `namespace`, `qosclass`, `id`, `pod/name`, `pod/namespace`, `pod/qosclass`,
`labels/<key>`, `annotations/<key>`, `pod/labels/<key>`, `pod/annotations/<key>`; any
other key is a container label (kubelet's `io.kubernetes.container.name` and
`io.kubernetes.pod.*` labels resolve to the names). `${key}` references in a text are
replaced by the keys' values (groupBy).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from resmgr.model import Container, Pod
from resmgr.policies.toolkit.errors import PolicyError

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


def parse_expression(raw: Any, where: str) -> Expression:
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




# `${key}`, or `$key` where the key runs on over letters, digits, `_` and `/` (nri-plugins takes
# both: `ns=$pod/namespace`).
_REFERENCE = re.compile(r"\$\{([^}]*)\}|\$([A-Za-z0-9_/]+)")


def substitute(text: str, container: Container, pod: Pod | None) -> str:
    """text with each `${key}` or `$key` replaced by the key's value for the container ("" when it
    has none)."""
    return _REFERENCE.sub(lambda m: resolve((m.group(1) or m.group(2)).strip(), container, pod) or "", text)
