"""Undo for a policy's own state, for state that is not a Grants (which journals its changes,
grants.py): what a failed change touched is put back as it was, so a request that cannot be met
leaves the policy exactly as it was."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


@contextmanager
def undone_on_failure(save: Callable[[], T], load: Callable[[T], None]) -> Iterator[None]:
    """Run the block; if it raises, load what save() returned before it."""
    saved = save()
    try:
        yield
    except BaseException:
        load(saved)
        raise
