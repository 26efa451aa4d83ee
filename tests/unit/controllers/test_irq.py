"""Interrupt affinity as balloons' irqClaim and irqMode say it, on /proc files laid out as the
kernel's (nri-plugins' test25-irq steps): claimed interrupts on the claimers' CPUs, the others on a
sink's or off an isolating balloon's, and every affinity back once nothing wants it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from resmgr.controllers.irq import IRQController
from resmgr.model import IrqPlan, QOSClass
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.interrupts import parse as interrupts
from tests.support.world import World, machine

PROC = """           CPU0       CPU1       CPU2       CPU3
  4:          0         15          0          0  IO-APIC   4-edge      ttyS0
  8:          0          0          0          0  IO-APIC   8-edge      rtc0
  9:          0          0          0          0  IO-APIC   9-fasteoi   acpi
 24:       2020          0          0          0  PCI-MSIX-0000:00:01.0   4-edge      virtio0-req.0
NMI:          0          0          0          0   Non-maskable interrupts
"""
ALL = "0-15"
N4C16 = machine("sockets=2,nodes=2,cores=2,threads=2,numbering=linear")


def proc(tmp: Path) -> Path:
    (tmp / "proc").mkdir()
    (tmp / "proc" / "interrupts").write_text(PROC)
    for irq in (4, 8, 9, 24):
        d = tmp / "proc" / "irq" / str(irq)
        d.mkdir(parents=True)
        (d / "smp_affinity_list").write_text(ALL + "\n")
    return tmp


def affinity(root: Path, irq: int) -> str:
    return (root / "proc" / "irq" / str(irq) / "smp_affinity_list").read_text().strip()


def balloons(*types: dict, **policy: object) -> World:
    return World("balloons", N4C16, ReservedResources={"cpu": "1000m"},
                 **{"balloons": {"BalloonTypes": list(types), **policy}})


def test_proc_interrupts_descriptions():
    assert interrupts(PROC) == {4: "IO-APIC 4-edge ttyS0", 8: "IO-APIC 8-edge rtc0", 9: "IO-APIC 9-fasteoi acpi",
                                24: "PCI-MSIX-0000:00:01.0 4-edge virtio0-req.0"}


def test_claimed_interrupts_go_to_the_claimers_cpus_and_back_when_it_goes(tmp_path):
    root = proc(tmp_path)
    w = balloons({"Name": "claimer", "MinCPUs": 2, "MaxCPUs": 2, "IrqClaim": ["*ttyS0*", "*rtc0*"]})
    c = w.add(QOSClass.GUARANTEED, 1000, annotations={"balloon.balloons.resource-policy.nri.io": "claimer"})
    irq = IRQController(str(root), str(tmp_path))
    irq.sync(w.policy.irq_plan())
    assert affinity(root, 4) == affinity(root, 8) == str(w.cpus(c)) and affinity(root, 9) == ALL
    w.policy.release(w.containers[c.key], w.view())
    again = IRQController(str(root), str(tmp_path))  # a restart meanwhile: what they were is on disk
    again.sync(w.policy.irq_plan())
    assert affinity(root, 4) == affinity(root, 8) == ALL


def test_isolate_keeps_unclaimed_interrupts_off_the_balloon_and_sink_draws_them(tmp_path):
    root = proc(tmp_path)
    w = balloons({"Name": "isolate", "MinCPUs": 2, "MaxCPUs": 2, "IrqMode": "isolate"},
                 {"Name": "sink", "MinCPUs": 2, "MaxCPUs": 2, "IrqMode": "sink"},
                 {"Name": "claimer", "MinCPUs": 2, "MaxCPUs": 2, "IrqClaim": ["*ttyS0*"]})
    iso = w.add(QOSClass.GUARANTEED, 1000, annotations={"balloon.balloons.resource-policy.nri.io": "isolate"})
    irq = IRQController(str(root), str(tmp_path))
    irq.sync(w.policy.irq_plan())
    assert CPUSet.parse(affinity(root, 8)) == CPUSet.parse(ALL) - w.cpus(iso)
    sink = w.add(QOSClass.GUARANTEED, 1000, annotations={"balloon.balloons.resource-policy.nri.io": "sink"})
    claimer = w.add(QOSClass.GUARANTEED, 1000, annotations={"balloon.balloons.resource-policy.nri.io": "claimer"})
    irq.sync(w.policy.irq_plan())
    assert affinity(root, 4) == str(w.cpus(claimer)) and affinity(root, 8) == affinity(root, 9) == str(w.cpus(sink))
    for c in (iso, sink, claimer):
        w.policy.release(w.containers[c.key], w.view())
    irq.sync(w.policy.irq_plan())
    assert [affinity(root, i) for i in (4, 8, 9, 24)] == [ALL] * 4


def test_only_controllable_interrupts_are_touched(tmp_path):
    root = proc(tmp_path)
    plan = IrqPlan(claims=((("*ttyS0*",), CPUSet.parse("2-3")),), sink=CPUSet.parse("4-5"),
                   controllable=("*acpi*", "*rtc0*"))
    irq = IRQController(str(root), str(tmp_path))
    irq.sync(plan)
    assert affinity(root, 4) == ALL  # claimed, but not controllable: left alone (and logged)
    assert affinity(root, 8) == affinity(root, 9) == "4-5"
    assert affinity(root, 24) == ALL  # not controllable


def test_topology_aware_irq_affinity_claims_and_masks_on_exclusive_cpus(tmp_path):
    """nri-plugins' topology-aware irq-affinity annotation (its test steps): claimed interrupts on
    the container's exclusive CPUs, masked ones kept off them, all back when the pod goes."""
    import pytest

    from resmgr.policies import PolicyError

    root = proc(tmp_path)
    w = World("topology-aware", N4C16, ReservedResources={"cpu": "750m"})
    pod = w.pod(QOSClass.GUARANTEED, annotations={
        "irq-affinity.resource-policy.nri.io/container.c0": 'claim: ["*ttyS0*"]\nmask: ["*"]\n',
        "irq-affinity.resource-policy.nri.io/container.c1": 'mask: ["*rtc0*"]\n'})
    c0 = w.add(QOSClass.GUARANTEED, 2000, pod=pod, name="c0")
    c1 = w.add(QOSClass.GUARANTEED, 2000, pod=pod, name="c1")
    irq = IRQController(str(root), str(tmp_path))
    irq.sync(w.policy.irq_plan())
    assert affinity(root, 4) == str(w.cpus(c0))
    assert CPUSet.parse(affinity(root, 8)) == CPUSet.parse(ALL) - w.cpus(c0) - w.cpus(c1)
    assert CPUSet.parse(affinity(root, 24)) == CPUSet.parse(ALL) - w.cpus(c0)  # "*": every interrupt
    for c in (c0, c1):
        w.policy.release(w.containers[c.key], w.view())
    irq.sync(w.policy.irq_plan())
    assert [affinity(root, i) for i in (4, 8, 9, 24)] == [ALL] * 4

    claim = {"irq-affinity.resource-policy.nri.io": 'claim: ["*ttyS0*"]'}
    with pytest.raises(PolicyError, match="QoS class Burstable is not Guaranteed"):
        w.add(QOSClass.BURSTABLE, 1000, annotations=claim)
    with pytest.raises(PolicyError, match="invalid without exclusive CPUs"):
        w.add(QOSClass.GUARANTEED, 250, annotations=claim)
    with pytest.raises(PolicyError, match="invalid IRQ affinity"):
        w.add(QOSClass.GUARANTEED, 1000, annotations={"irq-affinity.resource-policy.nri.io": "claim: xyzzy"})


def test_irq_affinity_modes_numbers_and_several_claimers(tmp_path):
    """nri-plugins' documented example: data-pump claims eth0's interrupt and masks every one
    (mask-first: its claim wins); mgmt claims every interrupt and masks eth0's (claim-first: its
    mask wins). eth0's goes to data-pump, the others to mgmt. An interrupt named by its number is
    matched too, and one several containers claim goes to all their CPUs."""
    import pytest

    from resmgr.policies import PolicyError

    root = proc(tmp_path)
    w = World("topology-aware", N4C16, ReservedResources={"cpu": "750m"})
    pod = w.pod(QOSClass.GUARANTEED, annotations={
        "irq-affinity.resource-policy.nri.io/container.data-pump": 'claim: ["*virtio0-req*"]\nmask: ["*"]\n',
        "irq-affinity.resource-policy.nri.io/container.mgmt": 'claim: ["*"]\nmask: ["*virtio0-req*"]\n'
                                                              'mode: claim-first\n'})
    pump = w.add(QOSClass.GUARANTEED, 2000, pod=pod, name="data-pump")
    mgmt = w.add(QOSClass.GUARANTEED, 2000, pod=pod, name="mgmt")
    irq = IRQController(str(root), str(tmp_path))
    irq.sync(w.policy.irq_plan())
    assert CPUSet.parse(affinity(root, 24)) == w.cpus(pump)
    assert [CPUSet.parse(affinity(root, i)) for i in (4, 8, 9)] == [w.cpus(mgmt)] * 3

    # By number, and claimed twice: the union of the claimers' CPUs.
    both = w.pod(QOSClass.GUARANTEED, annotations={"irq-affinity.resource-policy.nri.io": "claim: [8]"})
    a = w.add(QOSClass.GUARANTEED, 1000, pod=both, name="a")
    b = w.add(QOSClass.GUARANTEED, 1000, pod=both, name="b")
    irq.sync(w.policy.irq_plan())
    assert CPUSet.parse(affinity(root, 8)) == w.cpus(a) | w.cpus(b) | w.cpus(mgmt)

    with pytest.raises(PolicyError, match="invalid IRQ affinity mode 'last' \\(valid modes: mask-first, claim-"):
        w.add(QOSClass.GUARANTEED, 1000, annotations={"irq-affinity.resource-policy.nri.io": "mask: ['*']\nmode: last"})


def test_a_claim_on_an_interrupt_outside_the_controllable_ones_is_refused(tmp_path):
    """nri-plugins' test: with ControllableInterrupts ["*rtc0*"], a container claiming ttyS0's
    interrupt is refused, with the interrupt and the pattern named; so is a balloon type's claim."""
    import pytest

    from resmgr.policies import PolicyError

    machine_here = dataclasses.replace(N4C16, interrupts=interrupts((proc(tmp_path) / "proc/interrupts").read_text()))
    w = World("topology-aware", machine_here, ReservedResources={"cpu": "750m"},
              **{"topology-aware": {"ControllableInterrupts": ["*rtc0*"]}})
    denied = {"irq-affinity.resource-policy.nri.io": 'claim: ["*ttyS0*"]'}
    with pytest.raises(PolicyError, match="denied interrupt: irq 4 \\(IO-APIC 4-edge ttyS0\\) denied but matched "
                                          "by user pattern '\\*ttyS0\\*'"):
        w.add(QOSClass.GUARANTEED, 1000, annotations=denied)
    w.add(QOSClass.GUARANTEED, 1000, annotations={"irq-affinity.resource-policy.nri.io": 'claim: ["*rtc0*"]'})
    # A mask is checked too, and a number names an interrupt as a glob does.
    with pytest.raises(PolicyError, match="irq 9 .* by user pattern '9'"):
        w.add(QOSClass.GUARANTEED, 1000, annotations={"irq-affinity.resource-policy.nri.io": "mask: [9]"})

    types = [{"Name": "claimer", "IrqClaim": ["*ttyS0*"]}]
    with pytest.raises(PolicyError, match="balloon type claimer: denied interrupt: irq 4"):
        World("balloons", machine_here, ReservedResources={"cpu": "1000m"},
              balloons={"BalloonTypes": types, "ControllableInterrupts": ["*rtc0*"]})
    World("balloons", machine_here, ReservedResources={"cpu": "1000m"},
          balloons={"BalloonTypes": [{"Name": "claimer", "IrqClaim": ["*rtc0*"]}],
                    "ControllableInterrupts": ["*rtc0*"]})
