"""Finding whom a change moved: compare where everyone runs before and after it."""

from __future__ import annotations

from typing import Any

from resmgr.model import Container, Decision, Resources, View


class SnapshotMoves:
    """For a policy whose changes can move other containers, found by comparing snapshots (listed
    before Policy among its bases: its release is the policy's): the policy gives _snapshot (where
    shared containers run now), _remove (drop a container's grant; None if it held none) and _updates
    (the containers whose CPUs differ from a snapshot)."""

    def _snapshot(self) -> Any:
        raise NotImplementedError

    def _remove(self, key: str) -> Any | None:
        raise NotImplementedError

    def _updates(self, before: Any, view: View, skip: str) -> dict[str, Resources]:
        raise NotImplementedError

    def release(self, container: Container, view: View) -> Decision:
        before = self._snapshot()
        if self._remove(container.key) is None:
            return Decision()
        return Decision(updates=self._updates(before, view, container.key))
