"""Policy registry: maps policy names (and aliases) to implementations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resmgr.policies.balloons import BalloonsPolicy
from resmgr.policies.base import Decision, Policy, PolicyError, View
from resmgr.policies.none import NonePolicy
from resmgr.policies.podpools import PodpoolsPolicy
from resmgr.policies.static import StaticPolicy
from resmgr.policies.static_plus import StaticPlusPolicy
from resmgr.policies.toolkit.options import schema
from resmgr.policies.topology_aware import TopologyAwarePolicy
from resmgr.topology.model import Topology

__all__ = ["Decision", "Policy", "PolicyError", "View", "REGISTRY", "create", "names", "describe"]


@dataclass(frozen=True)
class Entry:
    name: str
    factory: type[Policy]
    description: str
    aliases: tuple[str, ...] = ()


REGISTRY: dict[str, Entry] = {}
_ALIASES: dict[str, str] = {}


def register(factory: type[Policy], aliases: tuple[str, ...] = ()) -> None:
    entry = Entry(factory.name, factory, factory.description, aliases)
    REGISTRY[entry.name] = entry
    for alias in aliases:
        _ALIASES[alias] = entry.name


register(NonePolicy, aliases=("null",))
register(StaticPolicy)
register(StaticPlusPolicy)
register(TopologyAwarePolicy)
register(BalloonsPolicy)
register(PodpoolsPolicy)


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
