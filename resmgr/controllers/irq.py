"""The interrupt controller: interrupt CPU affinity as the policy's IrqPlan says it.

After every change it reads /proc/interrupts, and for each interrupt it may touch (the plan's
`controllable` patterns; every one when there are none) writes /proc/irq/N/smp_affinity_list:
a claimed interrupt goes to its claims' CPUs, the others to the sink CPUs, or off the isolated
ones and the CPUs of the masks they match; late masks (claim-first) keep claimed ones off too.
What an affinity was before it was first written is kept in the state directory: an interrupt no
rule wants any more gets it back, also after a restart. An interrupt the kernel does not let
move (per-CPU, managed) is left alone.
"""

from __future__ import annotations

import logging
from pathlib import Path

from resmgr.controllers.originals import Originals
from resmgr.model import IrqPlan
from resmgr.topology.cpuset import CPUSet, CPUSetError, union
from resmgr.topology.interrupts import matches, parse

log = logging.getLogger("cri-resmgr.controllers.irq")


class IRQController:
    def __init__(self, host_root: str = "/", state_dir: str = "") -> None:
        self.proc = Path(host_root) / "proc"
        self.originals = Originals(state_dir, "irq-affinity.json")
        # interrupt -> its affinity before it was first written (an earlier run's too)
        self.saved = {int(k): v for k, v in self.originals.load().items() if k.isdigit()}
        self.denied: set[tuple[int, str]] = set()  # (interrupt, pattern) said once

    def sync(self, plan: IrqPlan) -> None:
        if plan.empty and not self.saved:
            return
        before = dict(self.saved)
        try:
            described = parse((self.proc / "interrupts").read_text())
        except OSError as err:
            log.error("interrupts: cannot read %s: %s", self.proc / "interrupts", err.strerror)
            return
        for irq, description in sorted(described.items()):
            wanted = self._wanted(plan, irq, description)
            if wanted is None:
                if irq in self.saved:
                    self._write(irq, self.saved.pop(irq))
                continue
            current = self._read(irq)
            if current is None:
                continue
            if irq not in self.saved:
                self.saved[irq] = current
            if wanted and wanted != _parse(current):
                if not self._write(irq, str(wanted)):
                    self.saved.pop(irq, None)  # the kernel keeps it where it is
        for irq in [i for i in self.saved if i not in described]:  # gone (a device removed)
            del self.saved[irq]
        if self.saved != before:
            self.originals.keep({str(k): v for k, v in self.saved.items()})

    def _wanted(self, plan: IrqPlan, irq: int, description: str) -> CPUSet | None:
        """The affinity the plan wants (None: no rule, as it was). Claims set it to their CPUs
        together, over masks; late masks (claim-first) take their CPUs off it all the same."""
        claim = union(cpus for patterns, cpus in plan.claims if cpus and matches(patterns, description, irq))
        late = union(cpus for patterns, cpus in plan.late_masks if matches(patterns, description, irq))
        if plan.controllable and not matches(plan.controllable, description, irq):
            if claim and (irq, description) not in self.denied:
                self.denied.add((irq, description))
                log.error("interrupt %d (%s) is claimed but not controllable (ControllableInterrupts): left alone",
                          irq, description)
            return None
        if claim and claim - late:
            return claim - late
        masked = late | union(cpus for patterns, cpus in plan.masks if matches(patterns, description, irq))
        if not (plan.sink or plan.isolate or masked):
            return None
        base = plan.sink or _parse(self.saved.get(irq) or self._read(irq) or "")
        return base - plan.isolate - masked or None

    def _read(self, irq: int) -> str | None:
        try:
            return (self.proc / "irq" / str(irq) / "smp_affinity_list").read_text().strip()
        except OSError:
            return None

    def _write(self, irq: int, cpus: str) -> bool:
        try:
            (self.proc / "irq" / str(irq) / "smp_affinity_list").write_text(cpus + "\n")
            return True
        except OSError as err:  # EIO: a per-CPU or managed interrupt the kernel does not let move
            log.debug("interrupt %d: cannot set its CPUs to %s: %s", irq, cpus, err.strerror)
            return False


def _parse(text: str) -> CPUSet:
    try:
        return CPUSet.parse(text)
    except CPUSetError:
        return CPUSet()
