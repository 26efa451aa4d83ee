"""The policy interface: pure decisions over the engine's state, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from resmgr.model import Container, Pod, Resources


@dataclass
class Decision:
    """What a policy decided for one lifecycle event.

    `resources` replaces the container's resources (None: leave the request as is);
    `updates` holds every *other* container whose resources changed, by container key.
    """

    resources: Resources | None = None
    rdt_class: str = ""
    blockio_class: str = ""
    updates: dict[str, Resources] = field(default_factory=dict)


@dataclass(frozen=True)
class View:
    """Read-only view of the engine state handed to a policy."""

    pods: Mapping[str, Pod]
    containers: Mapping[str, Container]


class Policy:
    """Base class; subclasses override what they act on. Instances must be deterministic."""

    name: str = ""
    description: str = ""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})

    def allocate(self, container: Container, pod: Pod, view: View) -> Decision:
        return Decision()

    def release(self, container: Container, view: View) -> Decision:
        return Decision()

    def update(self, container: Container, requested: Resources, view: View) -> Decision:
        return Decision()

    def export_state(self) -> dict[str, Any]:
        """Opaque policy data persisted with the engine state."""
        return {}

    def restore_state(self, data: Mapping[str, Any]) -> None:
        pass
