"""In what order containers move from CPUs to CPUs, so that none runs for a moment on a CPU another
one is still to leave: a container that takes CPUs goes after those that give them up; where each
waits for another (a swap, a cycle), one first steps aside (aside): onto its new CPUs but those
the others are still to leave, else onto the CPUs it keeps, else onto the CPUs it runs on but
those the others move onto.

The pusher applies this wave by wave, waiting for the runtime between them (relay mode); the NRI
runtime sends a whole sequence in one UpdateContainers call, which containerd applies in order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TypeVar

from resmgr.topology.cpuset import CPUSet

K = TypeVar("K", bound=Hashable)


def movable(todo: Iterable[K], leaves: Callable[[K], CPUSet], new: Callable[[K], CPUSet]) -> list[K]:
    """Those of todo that move onto no CPU another of them still runs on and is to leave."""
    leaving = {k: leaves(k) for k in todo}
    return [k for k in leaving if not any(cpus & new(k) for p, cpus in leaving.items() if p != k)]


def aside(k: K, todo: Iterable[K], held: CPUSet, leaves: Callable[[K], CPUSet], new: Callable[[K], CPUSet],
          gains: Callable[[K], CPUSet] | None = None) -> CPUSet:
    """Where k, running on held, may run for now without taking a CPU another of todo is still to
    leave: its new CPUs but those, else the CPUs it keeps, else (gains: the CPUs each container
    moves onto that it does not run on yet) the CPUs it runs on but those others move onto; empty
    where none helps (nothing left, or no change)."""
    blocked, taken = CPUSet(), CPUSet()
    for p in todo:
        if p != k:
            blocked |= leaves(p)
            if gains is not None:
                taken |= gains(p)
    steps = [new(k) - blocked, held & new(k)] + ([held - taken] if gains is not None else [])
    for step in steps:
        if step and step != held:
            return step
    return CPUSet()


def sequence(moves: Mapping[K, tuple[CPUSet, CPUSet]], narrow: bool = True) -> list[tuple[K, CPUSet]]:
    """Steps (container, CPUs to run on) for moves (container -> (CPUs it runs on, CPUs it is to run
    on); an empty "runs on" is not known). With narrow, the members of a swap or a cycle first get a
    step aside (aside); without it (an answer that holds one update per container) they go as they are."""
    held = {k: old for k, (old, _) in moves.items()}

    def new(k: K) -> CPUSet:
        return moves[k][1]

    def leaves(k: K) -> CPUSet:
        return held[k] - new(k) if held[k] and new(k) else CPUSet()

    def gains(k: K) -> CPUSet:
        return new(k) - held[k]

    steps: list[tuple[K, CPUSet]] = []
    todo = list(moves)
    while todo:
        wave = movable(todo, leaves, new)
        if not wave and narrow:
            for k in todo:  # one after the other: each step frees what the next may take
                step = aside(k, todo, held[k], leaves, new, gains)
                if step:
                    steps.append((k, step))
                    held[k] = step
            wave = movable(todo, leaves, new)
        wave = wave or todo  # nothing kept to step aside to: no order spares a moment
        steps += [(k, new(k)) for k in wave]
        for k in wave:
            held[k] = new(k)
        todo = [k for k in todo if k not in wave]
    return steps
