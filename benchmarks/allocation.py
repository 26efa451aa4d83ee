#!/usr/bin/env python3
"""Policy decision latency with many live containers.

On a generated 2-socket, 4-NUMA-node, 224-CPU machine, fills each policy with N live
containers (mostly shared, a few exclusive), then times allocate + release of one
more container, alternating shared (250m) and exclusive (2 CPUs) requests. Prints
p50/p99 per N for all decisions and for each kind: an exclusive grant moves the
shared pool, so its decision re-pins every shared container (O(N) by nature).

    python benchmarks/allocation.py [--counts 10,100,500,1000] [--rounds 300]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from resmgr import policies
from resmgr.engine.ledger import Ledger
from resmgr.model import Container, ContainerState, Pod, QOSClass, Resources
from resmgr.requests import milli_to_shares
from resmgr.topology.generate import generate, parse_spec
from resmgr.topology.sysfs import discover

MACHINE = "sockets=2,nodes=2,cores=28,threads=2"


def make(i: int, qos: QOSClass, milli: int) -> tuple[Pod, Container]:
    pod = Pod(id=f"p{i}", uid=f"u{i}", name=f"pod{i}", namespace="bench", qos_class=qos)
    res = Resources(cpu_shares=milli_to_shares(milli), cpu_period=100000,
                    cpu_quota=milli * 100 if qos == QOSClass.GUARANTEED else 0)
    return pod, Container(id=f"c{i}", pod_id=pod.id, name="app", state=ContainerState.RUNNING,
                          requested=res, resources=res)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))] * 1e6


def add(ledger: Ledger, pod: Pod, c: Container) -> None:
    """What the engine does for a create, without the runtime: the ledger places it."""
    if pod.id not in ledger.pods:
        ledger.add_pod(pod)
    ledger.record(ledger.place(c, pod).updates)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", default="10,100,500,1000")
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    topology = discover(generate(parse_spec(MACHINE), tempfile.mkdtemp(prefix="crirm-bench-")))
    print(f"machine: {MACHINE} ({len(topology.cpus)} CPUs, {len(topology.nodes)} NUMA nodes)")
    print(f"{'policy':<15}{'live':>6} | {'all p50':>8}{'p99':>8} | {'shared p50':>10}{'p99':>8} | "
          f"{'exclusive p50':>13}{'p99':>8} | {'release p50':>11}{'p99':>8}")
    for name in ("static", "static-plus", "topology-aware", "balloons"):
        for count in (int(c) for c in args.counts.split(",")):
            policy = policies.create(name, {"Active": name, "ReservedResources": {"cpu": 2}}, topology)
            sim = Ledger(policy)
            for i in range(count):  # 1 in 50 takes an exclusive CPU
                qos, milli = (QOSClass.GUARANTEED, 1000) if i % 50 == 0 else (QOSClass.BURSTABLE, 100)
                add(sim, *make(i, qos, milli))
            shared, exclusive, release = [], [], []
            for r in range(args.rounds):
                qos, milli = (QOSClass.GUARANTEED, 2000) if r % 2 else (QOSClass.BURSTABLE, 250)
                pod, c = make(count + 1 + r, qos, milli)
                t = time.perf_counter()
                add(sim, pod, c)
                (exclusive if r % 2 else shared).append(time.perf_counter() - t)
                t = time.perf_counter()
                sim.remove(c)
                release.append(time.perf_counter() - t)
            both = shared + exclusive
            print(f"{name:<15}{count:>6} | {pct(both, 50):>6.0f}us{pct(both, 99):>6.0f}us | "
                  f"{pct(shared, 50):>8.0f}us{pct(shared, 99):>6.0f}us | "
                  f"{pct(exclusive, 50):>11.0f}us{pct(exclusive, 99):>6.0f}us | "
                  f"{pct(release, 50):>9.0f}us{pct(release, 99):>6.0f}us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
