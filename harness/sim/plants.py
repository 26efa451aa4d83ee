"""Defects planted in the real engine, each an earlier fix undone, to prove the simulated node finds
them: `python -m harness.sim --plant NAME` runs seeds with one of them in place, and
tests/unit/harness/test_sim_plants.py holds each to the first seed that catches it.

A plant swaps one method or function of the engine for the one before its fix, for the life of a
`with` block in one process (the simulator's workers each plant it anew).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

from resmgr.engine import ledger, pusher
from resmgr.frontends.nri import plugin as nri_plugin
from resmgr.model import Resources
from resmgr.topology.cpuset import CPUSet


async def _nothing(*args: Any) -> None:
    return None


def _all_at_once(todo: Iterable[str], leaves: Callable[[str], CPUSet], new: Callable[[str], CPUSet]) -> list[str]:
    return list(todo)


@dataclass(frozen=True)
class Plant:
    fix: str  # what the fix it undoes made right
    target: Any  # the class or module whose attribute is swapped
    name: str
    stand_in: Any
    seed: int = 0  # the first seed (of 1-150) that catches it; 0: none does (why, in `fix`)
    switches: int = 0  # ... with this many policy switches a run (--switches)
    mode: str = "relay"  # ... with cri-resmgr in this mode (--mode)


def _own_lock(self: Any, key: str) -> asyncio.Lock:
    return asyncio.Lock()


def _narrowed_only(self: Any, cid: str, final: Resources, collector: Any) -> None:
    """NriPlugin._defer_onto before the simulated node's NRI mode: a move with nothing left once
    narrowed went whole in the answer, applied before the updated container's own."""
    given_up = self._runs_on(cid) - CPUSet.parse_or_empty(final.cpuset_cpus) if final.cpuset_cpus else CPUSet()
    later = {}
    for other, res in collector.updates.items():
        cpus = CPUSet.parse_or_empty(res.cpuset_cpus)
        now = cpus - given_up
        if other != cid and cpus & given_up and now:
            later[other] = res
            collector.updates[other] = dataclasses.replace(res, cpuset_cpus=str(now))
    if later:
        self._after_update.setdefault(cid, {}).update(later)
        asyncio.get_running_loop().call_later(nri_plugin.AFTER_UPDATE_WAIT, self._moves_after, cid)


PLANTS = {
    "sending": Plant("kubelet's update of a container goes to the runtime after a push of it in flight (the "
                     "simulated node, once it switched policies)", pusher.Pusher, "sending", _own_lock, 149, 3),
    "found": Plant("an adopted container holds the CPUs it was found on until its move lands (soak seed 536)",
                   pusher.Pusher, "found", lambda self, key, cpus: None, 21),
    "maybe": Plant("a push that failed counts as holding both the old CPUs and the new (soak seed 517)",
                   pusher.Pusher, "_maybe", lambda self, key, cpus: None, 6),
    "removed": Plant("nothing is sent to a container whose removal is under way: containerd 2.3.7 panics "
                     "(the hostile test)", pusher.Pusher, "_removed", lambda self, cid, pod: False, 3),
    "narrow": Plant("containers that swap CPUs first narrow to the CPUs they keep (a policy switch in the soak)",
                    pusher.Pusher, "narrow", lambda self, key, todo: _nothing(), 3, 3),
    "waves": Plant("of many pushes, those that give CPUs up land before those that take them (a switch in the "
                   "soak)", pusher, "movable", _all_at_once, 4, 3),
    "raced": Plant("an update sent while the runtime starts the container is taken only once it runs and is "
                   "sent again (the simulated node, once its containerd made tasks as containerd does)",
                   pusher.Pusher, "_raced", lambda self, key, starting: False, 16),
    "again": Plant("a container updated while the runtime started it is updated again once started: without it, "
                   "it stays pending and held where it may run, and reconciliation pushes it (slower, no "
                   "invariant broken)", pusher.Pusher, "again", lambda self, key: _nothing(), 0),
    "defer-whole": Plant("a move onto nothing but the CPUs an updated container gives up waits whole for its "
                         "update, in NRI mode (the simulated node's NRI mode)", nri_plugin.NriPlugin, "_defer_onto",
                         _narrowed_only, 2, 0, "nri"),
    "released-lately": Plant("a container the runtime lists running just after its stop is not granted again "
                             "(the soak): its only harm, an update to a stopped container, is no invariant",
                             ledger.Ledger, "released_lately", lambda self, c: False, 0),
}


@contextlib.contextmanager
def planted(name: str) -> Iterator[Plant]:
    """The engine with the named defect in place ("" : none)."""
    if not name:
        yield Plant("", None, "", None)
        return
    plant = PLANTS[name]
    with mock.patch.object(plant.target, plant.name, plant.stand_in):
        yield plant
