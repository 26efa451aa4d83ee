"""Container affinity and anti-affinity annotations.

The pod annotations `cri-resource-manager.intel.com/affinity` and `.../anti-affinity`
map a container name to a list of affinities, each `{scope, match, weight}` where scope
and match are expressions `{key, operator, values}`. The scope (default: the same pod)
bounds which containers are considered, the match picks those the weight applies to.
Weights default to 1; anti-affinities always push (negative weight). The shorthand
`name: [other, ...]` means a match on container names within the pod, both ways (as
cri-resource-manager and nri-plugins read it): `other` is drawn to `name` as well.

Expressions: policies/toolkit/expressions.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from resmgr.model import Container, Pod
from resmgr.policies.base import PolicyError
from resmgr.policies.toolkit.expressions import Expression, parse_expression

AFFINITY = "cri-resource-manager.intel.com/affinity"
ANTI_AFFINITY = "cri-resource-manager.intel.com/anti-affinity"
# The same annotations in nri-plugins' domains (its current one, and the one its tests still use).
DOMAINS = ("cri-resource-manager.intel.com", "resource-policy.nri.io", "nri-resmgr.intel.com")

@dataclass(frozen=True)
class Affinity:
    match: Expression
    weight: int
    scope: Expression | None = None  # None: containers of the same pod
    shorthand: bool = False  # written as a bare container name

    def in_scope(self, me: Container, other: Container, other_pod: Pod | None) -> bool:
        return other.pod_id == me.pod_id if self.scope is None else self.scope(other, other_pod)


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
                parsed.append(Affinity(Expression("name", "In", (str(item),)), sign, shorthand=True))
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
            scope = parse_expression(item["scope"], f"{where}, item {i}, scope") if item.get("scope") else None
            parsed.append(Affinity(parse_expression(item["match"], f"{where}, item {i}, match"),
                                   abs(weight) * sign if sign < 0 else weight, scope))
        out[str(name)] = parsed
    return out


def affinities(container: Container, pod: Pod) -> list[Affinity]:
    """The container's affinities and anti-affinities from its pod's annotations."""
    annotations = {**container.annotations, **pod.annotations}
    out: list[Affinity] = []
    for name, sign in (("affinity", 1), ("anti-affinity", -1)):
        annotation = next((f"{d}/{name}" for d in DOMAINS if annotations.get(f"{d}/{name}")), "")
        text = annotations.get(annotation)
        if not text:
            continue
        parsed = _parse(text, annotation, sign)
        own = parsed.get(container.name, [])
        out.extend(own)
        named = {a.match.values for a in own if a.shorthand}
        for name, items in parsed.items():
            if name == container.name or (name,) in named:
                continue
            if any(a.shorthand and container.name in a.match.values for a in items):
                out.append(Affinity(Expression("name", "In", (name,)), sign, shorthand=True))
    return out
