"""A container's life: the states `Container.state` takes and every step between them, each with
what causes it. A container moves only through `step`: the ledger's methods `made`, `started`,
`seen`, `revive` and `release` take it, and `named` for a container the runtime made under a name
another held, before it enters the ledger. A step the table does not name is a defect found where
it happens, not a state that reconciliation later repairs. docs/architecture.md draws the same
machine.

The runtime's word decides where the machine and the runtime disagree, with one exception: a
listing never moves a container back (RUNNING to CREATED). A listing is taken before the round
that reads it takes the lock; a start answered meanwhile is newer than it.
"""

from __future__ import annotations

from resmgr.model import Container, ContainerState

P, C, R, X = ContainerState.PENDING, ContainerState.CREATED, ContainerState.RUNNING, ContainerState.EXITED

# (from, to): what causes the step.
STEPS: dict[tuple[ContainerState, ContainerState], str] = {
    (P, C): "the runtime answered the create, or a listing found it made (made)",
    (P, R): "a listing found a create whose answer was lost made and already started (made)",
    (C, R): "the runtime started it, or a listing shows it running (started, seen)",
    (P, X): "a create refused or never made: released and forgotten (release)",
    (C, X): "its pod stopped before it started, or a listing shows it ended (release)",
    (R, X): "stopped, removed, or a listing shows it ended (release)",
    (X, C): "a listing shows a released container live again: it needs a grant again (revive)",
    (X, R): "a listing shows a released container running again: it needs a grant again (revive)",
}


class IllegalStep(RuntimeError):
    """A step the machine does not name: a defect of the engine."""


def step(c: Container, to: ContainerState) -> bool:
    """Move c to `to` (False: it was there already)."""
    if c.state == to:
        return False
    if (c.state, to) not in STEPS:
        raise IllegalStep(f"container {c.id or c.key}: no step from {c.state} to {to}")
    c.state = to
    return True


def named(c: Container, container_id: str) -> None:
    """c, not in the ledger yet (it takes over another's grant, or enters it), is what the runtime
    made under container_id."""
    step(c, C)
    c.id = container_id


def forward(now: ContainerState, listed: ContainerState) -> bool:
    """Whether a listing showing `listed` moves a live container that is `now` along (never back)."""
    return (now, listed) in STEPS and listed != X
