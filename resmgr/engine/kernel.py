"""A container's cgroup cpuset written by the engine itself, where the runtime has not applied its
update: it took it and runs as before (a runtime that lost the container's task answers success),
failed it (its own deadline on a busy node), or failed it without a word (containerd logs and
ignores a failed update an NRI answer carries). Reconciliation writes such a cgroup after a
round; a start writes those of the containers still on the starting one's CPUs, and its own where
it holds CPUs it was moved off, before it runs."""

from __future__ import annotations

import asyncio
import logging
import os

from resmgr.controllers.cgroups import tell_systemd
from resmgr.engine.state import EngineState
from resmgr.model import Container
from resmgr.topology.cpuset import CPUSet

log = logging.getLogger("cri-resmgr.engine")


class CgroupWriter:
    def __init__(self, state: EngineState) -> None:
        self.state = state
        self._written: dict[str, tuple[str, str]] = {}  # by container: the cpuset its cgroup was last written
        self._telling: set[asyncio.Task[None]] = set()

    def forget_gone(self) -> None:
        for key in [k for k in self._written if k not in self.state.containers]:
            del self._written[key]

    async def write(self, c: Container, why: str, tell_later: bool = False, narrow: str = "") -> bool:
        """Write c's granted cpuset into its cgroup (and tell its systemd scope, in the background with
        tell_later: an NRI event must be answered within the runtime's 2 s); whether written.
        A pending container is skipped: its grant may be a move that waits for CPUs another has not
        given up yet, which the pusher sends in steps. narrow: these CPUs instead (some of those it
        runs on), its memory nodes left, pending or not."""
        pod = self.state.pods.get(c.pod_id)
        res = c.resources
        if pod is None or (c.pending and not narrow) or self.state.cpusets is None:
            return False
        wanted = (narrow, "") if narrow else (res.cpuset_cpus, res.cpuset_mems)
        # Said once per grant: a cgroup the kernel keeps refusing is tried again every round.
        first = self._written.get(c.key) != wanted
        self._written[c.key] = wanted
        try:
            where = await asyncio.to_thread(self.state.cpusets.write, pod.cgroup_parent, c.id, *wanted)
        except OSError as err:
            (log.error if first else log.debug)("container %s: the runtime has not applied its update (%s), and "
                                                "its cgroup cannot be written: %s", c.id, why, err)
            return False
        if where is None:
            return False
        (log.warning if first else log.debug)("container %s: the runtime has not applied its update (%s); its "
                                              "cgroup's cpuset is written instead (cpus %s, mems %s)", c.id, why,
                                              wanted[0] or "-", wanted[1] or "-")
        unit = os.path.basename(where)
        if unit.endswith(".scope"):
            telling = self._tell(c.id, unit, *wanted, first)
            if tell_later:
                task = asyncio.create_task(telling)
                self._telling.add(task)
                task.add_done_callback(self._telling.discard)
            else:
                await telling
        return True

    @staticmethod
    async def _tell(cid: str, unit: str, cpus: str, mems: str, first: bool) -> None:
        told = await tell_systemd(unit, cpus, mems)
        if told:
            (log.warning if first else log.debug)("container %s: systemd was not told of its scope's new cpuset (%s); "
                                                  "it may put the old one back when it next applies the scope's "
                                                  "properties", cid, told)

    def _may_hold(self, c: Container, held: CPUSet) -> CPUSet:
        """The CPUs c may run on now: its grant; or, while its move waits (pending), those of its grant
        it runs on and those nobody else runs on and is to leave (the pusher sends the rest)."""
        mine = CPUSet.parse_or_empty(c.resources.cpuset_cpus)
        if not c.pending:
            return mine
        return (held & mine) | (mine - self.state.pusher.still_left(c.key))

    async def _write_held(self, c: Container, held: CPUSet, target: CPUSet, why: str) -> bool:
        """c's cgroup written with target where it holds CPUs outside it (its grant, or part of it)."""
        if not target or not held - target:
            return False
        if not c.pending and target == CPUSet.parse_or_empty(c.resources.cpuset_cpus):
            return await self.write(c, why, tell_later=True)
        return await self.write(c, why, tell_later=True, narrow=str(target))

    async def own(self, c: Container) -> bool:
        """Just before c runs: its own cgroup, where it holds CPUs it may not (a move the runtime took
        while it was making c's task, from the record as it was: the two at once), written with what
        it may hold; whether written."""
        pod, cpusets = self.state.pods.get(c.pod_id), self.state.cpusets
        if cpusets is None or pod is None or not c.resources.cpuset_cpus:
            return False
        cg = await asyncio.to_thread(cpusets.read, pod.cgroup_parent, c.id)
        held = CPUSet.parse_or_empty(cg[0]) if cg is not None else CPUSet()  # empty: the parent's, no move
        return await self._write_held(c, held, self._may_hold(c, held),
                                      "it is starting on CPUs it was moved off while being made")

    async def clear(self, c: Container, others: list[Container]) -> list[str]:
        """The cgroups of others that still hold some of c's CPUs, written with what they may hold (none
        of them) where the runtime took those; the ids written. The kernel's word, not the runtime's,
        decides whether c shares a CPU once it runs."""
        cpusets, mine = self.state.cpusets, CPUSet.parse_or_empty(c.resources.cpuset_cpus)
        where = [(o, self.state.pods[o.pod_id].cgroup_parent) for o in others if o.pod_id in self.state.pods]
        if cpusets is None or not mine or not where:
            return []
        seen = await asyncio.to_thread(lambda: [cpusets.read(parent, o.id) for o, parent in where])
        written = []
        for (o, _), cg in zip(where, seen, strict=True):
            # An empty cpuset.cpus is the parent's: every CPU.
            held = CPUSet.parse_or_empty(cg[0]) if cg is not None and cg[0] else mine
            if cg is not None and held & mine and not CPUSet.parse_or_empty(o.resources.cpuset_cpus) & mine:
                if await self._write_held(o, held, self._may_hold(o, held) - mine,
                                          f"it still runs on CPUs of container {c.id}, which is starting"):
                    written.append(o.id)
        return written
