"""Policy registry: maps policy names (and aliases) to implementations.

A policy's module is imported when the policy is first created (or described): a daemon loads
the one its configuration names, not all six.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resmgr.policies.base import Decision, Policy, PolicyError, View
from resmgr.policies.toolkit.options import schema
from resmgr.topology.model import Topology

__all__ = ["Decision", "Policy", "PolicyError", "View", "REGISTRY", "create", "names", "describe"]


@dataclass(frozen=True)
class Entry:
    name: str
    where: str  # "module:Class"
    aliases: tuple[str, ...] = ()

    @property
    def factory(self) -> type[Policy]:
        module, _, cls = self.where.partition(":")
        factory: type[Policy] = getattr(importlib.import_module(module), cls)
        return factory

    @property
    def description(self) -> str:
        return self.factory.description


REGISTRY: dict[str, Entry] = {}
_ALIASES: dict[str, str] = {}


def register(name: str, where: str, aliases: tuple[str, ...] = ()) -> None:
    REGISTRY[name] = Entry(name, where, aliases)
    for alias in aliases:
        _ALIASES[alias] = name


register("none", "resmgr.policies.none:NonePolicy", aliases=("null",))
register("static", "resmgr.policies.static:StaticPolicy")
register("static-plus", "resmgr.policies.static_plus:StaticPlusPolicy")
register("topology-aware", "resmgr.policies.topology_aware:TopologyAwarePolicy")
register("balloons", "resmgr.policies.balloons:BalloonsPolicy")
register("podpools", "resmgr.policies.podpools:PodpoolsPolicy")


def canonical(name: str) -> str:
    """The registered name for name or alias; KeyError naming the choices otherwise."""
    name = _ALIASES.get(name, name)
    if name not in REGISTRY:
        raise KeyError(f"unknown policy {name!r}; available: {', '.join(names())}")
    return name


def names() -> list[str]:
    return sorted(REGISTRY) + sorted(_ALIASES)


def create(name: str, config: Mapping[str, Any] | None = None, topology: Topology | None = None) -> Policy:
    """A policy instance; config is the whole `policy` section (PolicyError if unacceptable)."""
    return REGISTRY[canonical(name)].factory(config, topology)


def describe() -> str:
    """The --list-policies text."""
    lines = ["Available policies:"]
    for name in sorted(REGISTRY):
        entry = REGISTRY[name]
        alias = f" (alias: {', '.join(entry.aliases)})" if entry.aliases else ""
        lines.append(f"  * {name}: {entry.description}{alias}")
    return "\n".join(lines)


def declared_sections() -> dict[str, Any]:
    """The schema of every registered policy's section, by policy name."""
    return {name: schema(entry.factory.options, entry.description) for name, entry in sorted(REGISTRY.items())}
