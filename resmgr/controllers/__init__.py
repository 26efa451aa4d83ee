"""Controllers: make a container's named classes (RDT, block I/O) real on the node.

Policies name each container's RDT and block-I/O class; a controller turns the name into
kernel settings after the container starts (and again after updates or a configuration
change). Each has a mode from `resource-manager.control.<name>.Mode`:

- `relaxed` (default): if the node cannot do it, say so once and carry on;
- `required`: a node that cannot do it refuses the configuration (and start-up);
- `disabled`: do nothing.

A configuration is applied in two steps so a refusal anywhere changes nothing: every
controller prepares (validates) the new section first, and only then do all commit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from resmgr.model import Container, Pod

log = logging.getLogger("cri-resmgr.config.manager")


class ControllerError(Exception):
    """A configuration or a container request a controller cannot accept."""


class Controller(Protocol):
    name: str

    def prepare(self, section: dict[str, Any], mode: str) -> Callable[[], None]:
        """Validate a configuration section; return what puts it in force (ControllerError if not)."""
        ...

    def check(self, container: Container, pod: Pod) -> None:
        """Refuse a container whose annotation names a class that does not exist."""
        ...

    def apply(self, container: Container, pod: Pod) -> None:
        """Put a running container into its class."""
        ...


def mode_of(config_data: dict[str, Any], name: str) -> str:
    control = config_data.get("resource-manager.control") or {}
    return str((control.get(name) or {}).get("Mode", "relaxed"))


class Controllers:
    def __init__(self, controllers: list[Controller]) -> None:
        self.controllers = controllers

    def prepare(self, config_data: dict[str, Any]) -> Callable[[], None]:
        """Validate every controller's section; the returned call commits them all."""
        commits = []
        for c in self.controllers:
            mode = mode_of(config_data, c.name)
            try:
                commits.append(c.prepare(dict(config_data.get(c.name) or {}), mode))
            except ControllerError as err:
                raise ControllerError(f"{c.name}: {err}") from None

        def commit() -> None:
            for fn in commits:
                fn()
        return commit

    def check(self, container: Container, pod: Pod) -> None:
        for c in self.controllers:
            c.check(container, pod)

    async def apply(self, container: Container, pod: Pod) -> None:
        """Put a running container into its classes; the writes run off the event loop, so a
        slow filesystem never stalls the calls in flight."""
        if self.controllers:
            await asyncio.to_thread(self._apply, container, pod)

    def _apply(self, container: Container, pod: Pod) -> None:
        for c in self.controllers:
            try:
                c.apply(container, pod)
            except Exception as err:  # one container's trouble must not break its lifecycle call
                log.error("%s: cannot put container %s into its class: %s", c.name, container.id, err)


T = TypeVar("T")


async def follow(changed: Callable[[int], Awaitable[None]], count: Callable[[], int], wanted: Callable[[], T],
                 apply: Callable[[T], None]) -> None:
    """For the daemon's life: after each change of the engine's state (changed(seen) returns once
    count() moved past seen), what the policy wants of the node now (CPU classes, interrupts)
    applied off the event loop when it differs from the last."""
    seen, last = -1, None
    while True:
        await changed(seen)
        seen = count()
        now = wanted()
        if now != last:
            await asyncio.to_thread(apply, now)
            last = now
