"""nri-plugins' policy custom resources (`config.nri/v1alpha1`) read as our configuration.

A file holding a `BalloonsPolicy` or `TopologyAwarePolicy` resource, as nri-plugins'
documentation writes them, becomes the `policy` section: `availableResources` and
`reservedResources` go to `policy.AvailableResources` / `ReservedResources`, the rest of
`spec` to `policy.<name>` (whose keys match in any letter case), `control.cpu` (CPU classes) to
the `cpu` section. What configures nri-plugins' own process (`agent`, `instrumentation`, `log`)
and its other controls has no counterpart here: it is left out and named, so nothing is dropped
silently.
"""

from __future__ import annotations

from typing import Any

KINDS = {"balloonspolicy": "balloons", "topologyawarepolicy": "topology-aware"}
LEFT_OUT = ("agent", "instrumentation", "log", "control")
RESOURCES = {"availableresources": "AvailableResources", "reservedresources": "ReservedResources"}


class NotAPolicy(ValueError):
    pass


def is_custom_resource(doc: Any) -> bool:
    return isinstance(doc, dict) and str(doc.get("apiVersion", "")).startswith("config.nri/")


def translate(doc: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Our configuration for the resource, and the spec keys left out."""
    kind = str(doc.get("kind", ""))
    policy = KINDS.get(kind.lower())
    if policy is None:
        raise NotAPolicy(f"kind {kind or '(none)'} of {doc.get('apiVersion')} is not a policy cri-resmgr runs "
                         "(BalloonsPolicy, TopologyAwarePolicy)")
    spec = doc.get("spec") or {}
    if not isinstance(spec, dict):
        raise NotAPolicy(f"{kind}: spec must be a mapping")
    section: dict[str, Any] = {"Active": policy}
    options: dict[str, Any] = {}
    out: dict[str, Any] = {"policy": section}
    left_out = []
    for key, value in spec.items():
        lowered = str(key).lower()
        if lowered in RESOURCES:
            section[RESOURCES[lowered]] = value
        elif lowered == "control" and isinstance(value, dict):
            for name, control in value.items():
                if str(name).lower() == "cpu":
                    out["cpu"] = control
                else:
                    left_out.append(f"{key}.{name}")
        elif lowered in LEFT_OUT:
            left_out.append(str(key))
        else:
            options[key] = value
    section[policy] = options
    return out, left_out
