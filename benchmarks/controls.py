#!/usr/bin/env python3
"""What the controls beyond CPUs and memory cost per placement: CPU classes, interrupt affinity
and scheduling classes, against the placement decision alone.

After each change of the engine's state the daemon asks the policy what it wants of the node
(`Policy.cpu_classes()`, `Policy.irq_plan()`, on the event loop) and, when that differs from the
last, has the CPU and interrupt controllers write it (in a thread); a started container's threads
get its scheduling class. This runs the same steps on a generated machine: topology-aware with a
class for each pool and every Guaranteed container claiming interrupts by the irq-affinity
annotation, the controllers writing the generated sysfs and /proc files (kernel file layouts on a
tmpfs-like directory, so writes cost less than the kernel's own handlers would). The scheduling
class is set with the real system calls on real threads of this process.

    .venv/bin/python benchmarks/controls.py [--containers 200] [--machine sockets=2,nodes=4,cores=16,threads=2]
                                            [--irqs 256] [--threads 16]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resmgr.controllers.cpu import CPUController  # noqa: E402
from resmgr.controllers.irq import IRQController  # noqa: E402
from resmgr.controllers.sched import set_io_priority, set_scheduling  # noqa: E402
from resmgr.model import Container, QOSClass, SchedulingClass  # noqa: E402
from resmgr.topology.generate import generate, parse_spec  # noqa: E402
from resmgr.topology.sysfs import discover  # noqa: E402
from tests.support.world import World  # noqa: E402

CLASSES = {"Classes": {"fast": {"MinFreq": 2000000, "MaxFreq": 3500000, "FreqGovernor": "performance"},
                       "slow": {"MaxFreq": 1200000, "DisabledCstates": ["C6"]},
                       "shared": {"EnergyPerformancePreference": "balance_power"}}}
POLICY = {"ReservedPoolCPUClass": "slow", "SharedPoolCPUClass": "shared", "DefaultExclusiveCPUClass": "fast",
          "ControllableInterrupts": ["*eth0*"]}
LIVE = 24  # containers running at once: a churn of one in, one out
IRQ_HINT = {"irq-affinity.resource-policy.nri.io": "claim: ['*eth0-rx*']"}


def fake_interrupts(root: Path, count: int, cpus: str) -> None:
    """/proc/interrupts and /proc/irq/N/smp_affinity_list of count interrupts, a NIC's queues among them."""
    lines = ["           CPU0"]
    for n in range(count):
        name = f"eth0-rx-{n}" if n % 4 == 0 else f"nvme0q{n}"
        lines.append(f"{n + 24:>4}:          0  PCI-MSIX-0000:00:{n % 32:02x}.0 {n}-edge      {name}")
        d = root / "proc" / "irq" / str(n + 24)
        d.mkdir(parents=True)
        (d / "smp_affinity_list").write_text(cpus + "\n")
    (root / "proc" / "interrupts").write_text("\n".join(lines) + "\n")


def figures(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (f"{name:<46} p50 {statistics.median(ms):7.3f} ms   p99 {p99:7.3f} ms   max {ms[-1]:7.3f} ms   "
            f"mean {statistics.fmean(ms):7.3f} ms")


def timed(into: list[float], fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    into.append(time.perf_counter() - t)
    return out


def step(w: World, gone: Container | None, qos: QOSClass, milli: int, annotations: dict[str, str]) -> Container:
    """One placement, and the oldest container removed once LIVE run (churn)."""
    if gone is not None:
        w.remove(gone)
    return w.add(qos, milli, annotations=annotations)


def sched_cost(threads: int, rounds: int) -> list[float]:
    """Seconds to give `threads` live threads of this process a scheduling class (policy, nice and
    I/O priority), as the controller does for a started container's threads."""
    stop = threading.Event()
    workers = [threading.Thread(target=stop.wait, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    tids = [w.native_id for w in workers if w.native_id is not None]
    cls = SchedulingClass(name="batch", policy="batch", nice=5, io_class="be", io_priority=6)
    out = []
    try:
        for _ in range(rounds):
            t = time.perf_counter()
            for tid in tids:
                set_scheduling(tid, cls)
                set_io_priority(tid, cls)
            out.append(time.perf_counter() - t)
    finally:
        stop.set()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--containers", type=int, default=200, help="placements (default: %(default)s)")
    ap.add_argument("--machine", default="sockets=2,nodes=4,cores=16,threads=2",
                    help="generated machine (default: %(default)s)")
    ap.add_argument("--irqs", type=int, default=256, help="interrupts in /proc/interrupts (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=16, help="threads per container (default: %(default)s)")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="crirm-controls-"))
    try:
        host = generate(parse_spec(args.machine), root / "host")
        topology = discover(host)
        fake_interrupts(host, args.irqs, str(topology.online))
        (root / "state").mkdir()
        cpu = CPUController(str(host), str(root / "state"))
        cpu.prepare(CLASSES, "relaxed")()
        irq = IRQController(str(host), str(root / "state"))
        bare = World("topology-aware", topology, ReservedResources={"cpu": "2000m"})
        world = World("topology-aware", topology, ReservedResources={"cpu": "2000m"}, **{"topology-aware": POLICY})

        decide, bare_decide, wanted, cpu_sync, irq_sync, total = [], [], [], [], [], []
        last_classes, last_plan = None, None
        live: list[tuple] = []
        for i in range(args.containers):
            guaranteed = i % 3 == 0
            qos, milli = (QOSClass.GUARANTEED, 2000) if guaranteed else (QOSClass.BURSTABLE, 200)
            annotations = IRQ_HINT if guaranteed else {}
            old = live.pop(0) if len(live) >= LIVE else None
            t0 = time.perf_counter()
            c = timed(decide, step, world, old and old[1], qos, milli, annotations)
            classes = timed(wanted, world.policy.cpu_classes)
            plan = world.policy.irq_plan()
            if classes != last_classes:
                timed(cpu_sync, cpu.sync, classes)
                last_classes = classes
            if plan != last_plan:
                timed(irq_sync, irq.sync, plan)
                last_plan = plan
            total.append(time.perf_counter() - t0)
            made = timed(bare_decide, step, bare, old and old[0], qos, milli, annotations)
            live.append((made, c))
        sched = sched_cost(args.threads, 50)

        print(f"{args.containers} placements, {LIVE} containers running (a third Guaranteed of 2 CPUs claiming "
              f"{args.irqs // 4} of {args.irqs} interrupts) on {args.machine}: {len(topology.online)} CPUs")
        print(figures("decision alone (no classes, no controllers)", bare_decide))
        print(figures("decision", decide))
        print(figures("what the policy wants (cpu_classes, irq_plan)", wanted))
        print(figures(f"CPU classes written ({len(cpu_sync)} changes)", cpu_sync))
        print(figures(f"interrupts written ({len(irq_sync)} changes)", irq_sync))
        print(figures("decision and every control, per placement", total))
        print(figures(f"scheduling class on {args.threads} threads", sched))
        ratio = statistics.fmean(total) / statistics.fmean(bare_decide)
        print(f"per placement with the controls: {ratio:.1f}x the decision alone (means; the writes run in a "
              "thread, off the event loop)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
