#!/usr/bin/env python3
"""Placement quality: how well each policy places random workload mixes, against kubelet.

Seeded random mixes (Guaranteed whole CPUs, fractional Burstable, best-effort, memory-heavy
Guaranteed; pods come and go, admitted while their requests fit the allocatable CPUs as the
scheduler would) are placed on generated machines, and on sysfs trees given with
`--host-root`, by each policy and by a model of kubelet's static CPU manager
(benchmarks/kubelet_cpu.py) with its options. For Guaranteed containers of 2 CPUs or more,
judged when placed, it prints the share:

- whole: on whole physical cores (at most one half core for an odd count);
- L2 / L3 / NUMA: within one L2 cluster, one L3 domain, one NUMA node;
- mem: memory pinned to the NUMA nodes of its CPUs (unpinned counts only on one-node machines);

and over all Guaranteed containers `E`: on efficient cores (hybrid parts); over all admitted
containers `refused`.

    python benchmarks/placement.py [--seeds 5] [--steps 300] [--host-root DIR] [--machines ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.kubelet_cpu import KubeletStatic, Options, Refused  # noqa: E402
from resmgr import policies  # noqa: E402
from resmgr.app.simulate import load_pods  # noqa: E402
from resmgr.engine.ledger import Ledger  # noqa: E402
from resmgr.policies import PolicyError  # noqa: E402
from resmgr.requests import parse_memory  # noqa: E402
from resmgr.topology.cpuset import CPUSet  # noqa: E402
from resmgr.topology.generate import generate, parse_spec  # noqa: E402
from resmgr.topology.model import CoreKind, Topology  # noqa: E402
from resmgr.topology.sysfs import discover  # noqa: E402

MACHINES = {
    "desktop-8p8e": "cores=8,threads=2,ecores=8,ecluster=4,numbering=linear,mem=64G",
    "2-socket-snc": "sockets=2,nodes=2,cores=14,threads=2,mem=96G",
    "2-socket-8l3": "sockets=2,cores=32,threads=2,l3=8,mem=256G",
    "4-socket": "sockets=4,cores=18,threads=2,mem=192G",
}
RESERVED = 2  # CPUs (1 on machines of fewer than 8)
BALLOONS = {"BalloonTypes": [
    {"Name": "guaranteed", "PreferNewBalloons": True,
     "MatchExpressions": [{"key": "pod/qosclass", "operator": "In", "values": ["Guaranteed"]}]},
    {"Name": "shared", "Namespaces": ["*"]}]}
POLICIES: dict[str, dict[str, Any]] = {
    "static": {}, "static-plus": {}, "topology-aware": {},
    "topology-aware ExclusiveInOneLeaf: false": {"topology-aware": {"ExclusiveInOneLeaf": False}},
    "balloons": {"balloons": BALLOONS}}
KUBELET = [Options(), Options(full_pcpus_only=True),
           Options(full_pcpus_only=True, align_by_uncore_cache=True),
           Options(full_pcpus_only=True, distribute_across_numa=True)]


def mix(seed: int, steps: int, topology: Topology) -> list[tuple[str, Any]]:
    """("add", pod document) and ("remove", pod name) events."""
    rng = random.Random(seed)
    node_mem = max(n.memory for n in topology.nodes.values()) >> 30
    out: list[tuple[str, Any]] = []
    live: list[str] = []
    for i in range(steps):
        if live and rng.random() < 0.3:
            out.append(("remove", live.pop(rng.randrange(len(live)))))
            continue
        kind = rng.choices(["guaranteed", "fractional", "besteffort", "memory"], [5, 3, 1, 1])[0]
        name = f"{kind}-{i}"
        if kind in ("guaranteed", "memory"):
            cpu = rng.choice([1, 2, 2, 3, 4, 4, 6, 8] if kind == "guaranteed" else [2, 4])
            mem = f"{rng.randint(1, 4)}Gi" if kind == "guaranteed" else f"{max(node_mem // 3, 1)}Gi"
            c = {"name": "main", "requests": {"cpu": cpu, "memory": mem}, "limits": {"cpu": cpu, "memory": mem}}
        elif kind == "fractional":
            c = {"name": "main", "requests": {"cpu": f"{rng.choice([250, 500, 1500, 2500])}m", "memory": "512Mi"}}
        else:
            c = {"name": "main"}
        out.append(("add", {"name": name, "containers": [c]}))
        live.append(name)
    return out


@dataclass
class Score:
    multi: int = 0
    whole: int = 0
    l2: int = 0
    l3: int = 0
    numa: int = 0
    local: int = 0
    guaranteed: int = 0
    ecore: int = 0
    admitted: int = 0
    refused: int = 0

    def __add__(self, other: Score) -> Score:
        return Score(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)))

    def judge(self, topo: Topology, cpus: CPUSet, mems: CPUSet | None, count: int) -> None:
        self.guaranteed += 1
        if topo.hybrid and cpus & topo.kinds.get(CoreKind.EFFICIENT, CPUSet()):
            self.ecore += 1
        if count < 2:
            return
        self.multi += 1
        cores = {topo.core_of[c] for c in cpus}
        partial = sum(1 for k in cores if not topo.cores[k] <= cpus)
        smt = any(len(topo.cores[k]) > 1 for k in cores)
        self.whole += partial <= (len(cpus) % 2 if smt else 0)
        self.l2 += len({topo.l2_of[c] for c in cpus}) == 1
        self.l3 += len({topo.l3_of[c] for c in cpus}) == 1
        nodes = {topo.cpus[c].node for c in cpus}
        self.numa += len(nodes) == 1
        dram = {n.id for n in topo.nodes.values() if n.cpus}
        self.local += ({m for m in mems if m in dram} <= nodes) if mems else len(dram) <= 1

    def row(self) -> str:
        def pct(a: int, b: int) -> str:
            return f"{100 * a / b:5.1f}%" if b else "    - "
        return " ".join(pct(a, b) for a, b in ((self.whole, self.multi), (self.l2, self.multi), (self.l3, self.multi),
                                               (self.numa, self.multi), (self.local, self.multi),
                                               (self.ecore, self.guaranteed), (self.refused, self.admitted)))


def reserved(topo: Topology) -> int:
    return RESERVED if len(topo.online) >= 8 else 1


def guaranteed_cpus(pod: dict[str, Any]) -> int:
    c = pod["containers"][0]
    limits = c.get("limits") or {}
    return int(limits["cpu"]) if "cpu" in limits and limits == c.get("requests") else 0


def requested_milli(pod: dict[str, Any]) -> int:
    cpu = str((pod["containers"][0].get("requests") or {}).get("cpu", "0"))
    return int(cpu[:-1]) if cpu.endswith("m") else int(cpu) * 1000


class Admission:
    """The scheduler's view: pods are sent here while their CPU and memory requests fit the node."""

    def __init__(self, topo: Topology) -> None:
        self.allocatable, self.used = 1000 * (len(topo.online) - reserved(topo)), 0
        self.memory, self.memory_used = sum(n.memory for n in topo.nodes.values()), 0
        self.held: dict[str, tuple[int, int]] = {}

    def admit(self, pod: dict[str, Any]) -> bool:
        milli, memory = requested_milli(pod), parse_memory(str(pod["containers"][0].get("requests", {}).get(
            "memory", "0")))
        if self.used + milli > self.allocatable or self.memory_used + memory > self.memory:
            return False
        self.held[pod["name"]] = milli, memory
        self.used += milli
        self.memory_used += memory
        return True

    def leave(self, name: str) -> None:
        milli, memory = self.held.pop(name, (0, 0))
        self.used -= milli
        self.memory_used -= memory


def run_policy(label: str, extra: dict[str, Any], topo: Topology, events: list[tuple[str, Any]]) -> Score:
    name = label.split()[0]  # a label may name an option after the policy
    try:
        policy = policies.create(name, {"Active": name, "ReservedResources": {"cpu": reserved(topo)}, **extra}, topo)
    except PolicyError as err:
        raise SystemExit(f"{name} cannot run on this machine: {err}") from None
    ledger = Ledger(policy)
    score, live, admission = Score(), {}, Admission(topo)
    for kind, what in events:
        if kind == "remove":
            if what in live:
                admission.leave(what)
                for c in live.pop(what):
                    ledger.remove(c)
            continue
        if not admission.admit(what):
            continue
        ((pod, containers),) = load_pods([what])
        pod.id = pod.uid = what["name"]
        for c in containers:
            c.pod_id, c.id = pod.id, f"{pod.id}-{c.name}"
        score.admitted += 1
        ledger.add_pod(pod)
        try:
            for c in containers:
                ledger.record(ledger.place(c, pod).updates)
        except PolicyError:
            score.refused += 1
            admission.leave(what["name"])
            for c in containers:
                if c.key in ledger.containers:
                    ledger.remove(c)
            ledger.pods.pop(pod.id, None)
            continue
        live[what["name"]] = containers
        count = guaranteed_cpus(what)
        if count:
            res = containers[0].resources
            score.judge(topo, CPUSet.parse(res.cpuset_cpus),
                        CPUSet.parse(res.cpuset_mems) if res.cpuset_mems else None, count)
    return score


def run_kubelet(options: Options, topo: Topology, events: list[tuple[str, Any]]) -> Score:
    kubelet = KubeletStatic(topo, reserved(topo), options)
    score, live, admission = Score(), {}, Admission(topo)
    for kind, what in events:
        if kind == "remove":
            if what in live:
                admission.leave(what)
                kubelet.release(live.pop(what))
            continue
        if not admission.admit(what):
            continue
        score.admitted += 1
        count, cpus = guaranteed_cpus(what), CPUSet()
        if count:
            try:
                cpus = kubelet.allocate(count)
            except Refused:
                score.refused += 1
                admission.leave(what["name"])
                continue
            score.judge(topo, cpus, None, count)
        live[what["name"]] = cpus
    return score


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--host-root", action="append", default=[], metavar="DIR",
                    help="also a machine read from DIR/sys (repeatable)")
    ap.add_argument("--machines", default=",".join(MACHINES),
                    help=f"generated machines, by name ({', '.join(MACHINES)}; '' for none)")
    args = ap.parse_args()
    unknown = [n for n in filter(None, args.machines.split(",")) if n not in MACHINES]
    if unknown:
        ap.error(f"unknown machine {unknown[0]!r} (known: {', '.join(MACHINES)})")
    machines = [(n, discover(generate(parse_spec(MACHINES[n]), tempfile.mkdtemp(prefix="crirm-place-"))))
                for n in filter(None, args.machines.split(","))]
    machines += [(root, discover(root)) for root in args.host_root]
    print(f"{args.seeds} mixes of {args.steps} events per machine, {RESERVED} CPUs reserved (1 under 8 CPUs); "
          "whole..mem over Guaranteed containers of 2+ CPUs, E over all Guaranteed ones, refused over all admitted")
    for mname, topo in machines:
        print(f"\n{mname}: {len(topo.online)} CPUs, {len(topo.packages)} package(s), {len(topo.nodes)} node(s), "
              f"{len(set(topo.l3_of.values()))} L3, {len(set(topo.l2_of.values()))} L2 domains")
        print(f"  {'placement':<62} {'whole':>6} {'L2':>6} {'L3':>6} {'NUMA':>6} {'mem':>6} {'E':>6} {'refused':>6}")
        mixes = [mix(seed, args.steps, topo) for seed in range(args.seeds)]
        for name, extra in POLICIES.items():
            total = sum((run_policy(name, extra, topo, events) for events in mixes), Score())
            print(f"  {name:<62} {total.row()}")
        for options in KUBELET:
            total = sum((run_kubelet(options, topo, events) for events in mixes), Score())
            print(f"  {options.label:<62} {total.row()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
