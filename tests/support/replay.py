"""Replaying nri-plugins' end-to-end policy scenarios through `simulate`.

nri-plugins tests its policies on a 16-CPU virtual machine (n4c16: 2 packages x 2 NUMA
nodes x 2 cores x 2 threads, CPUs numbered linearly, so node n holds CPUs 4n..4n+3) by
creating pods with kubectl and checking each container's allowed CPUs and memory nodes.
A Replay tells the same stories to a Simulation: pods are named as there (pod0, pod1,
... with containers pod0c0, pod0c1, ...), and every check is a Python expression over
the containers' placement (`cpus`, `nodes`, `packages`, `dies`, `cores`, `mems`: name ->
set of IDs; `pool`: name -> its pool or balloon; `instances`: balloon type -> how many;
`cpu_class`: pool -> its CPU class; `apart(*sets)`: pairwise disjoint). Each check's outcome is recorded; the
test decides what share must hold and which misses are known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from resmgr.app.simulate import Simulation, SimulationError, _pod
from resmgr.config import ConfigError, validate
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.model import Topology
from tests.support import machines

N4C16 = "sockets=2,nodes=2,cores=2,threads=2,numbering=linear,mem=2G"
_MACHINES: dict[str, Topology] = {}


def machine(spec: str = N4C16) -> Topology:
    if spec not in _MACHINES:
        _MACHINES[spec] = machines.machine(spec)
    return _MACHINES[spec]


def apart(*sets: set[int]) -> bool:
    """Pairwise disjoint."""
    seen: set[int] = set()
    for s in sets:
        if seen & s:
            return False
        seen |= s
    return True


@dataclass
class Check:
    scenario: str
    expression: str
    held: bool
    error: str = ""


@dataclass
class Replay:
    scenario: str
    config: str  # YAML of the configuration
    spec: str = N4C16
    constants: dict[str, Any] = field(default_factory=dict)  # more names the checks see
    checks: list[Check] = field(default_factory=list)
    count: int = 0
    serial: int = 0

    def __post_init__(self) -> None:
        self.topology = machine(self.spec)
        self.sim = Simulation(self.topology, validate(yaml.safe_load(self.config), self.scenario))

    # -- the stories' verbs -----------------------------------------------------------------
    def create(self, qos: str, contcount: int = 1, cpu: str = "", mem: str = "", cpureq: str = "",
               cpulim: str = "", memreq: str = "", memlim: str = "", namespace: str = "default",
               annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
               fail: bool = False) -> str:
        """A pod of contcount containers, as nri-plugins' guaranteed, burstable and besteffort
        templates make them; fail: it is expected to be refused (a check)."""
        name = f"pod{self.count}"
        self.count += 1
        containers = []
        for i in range(contcount):
            requests: dict[str, str] = {}
            limits: dict[str, str] = {}
            if qos == "guaranteed":
                for key, value in (("cpu", cpu or "1"), ("memory", mem or "100M")):
                    requests[key] = limits[key] = value
            elif qos == "burstable":
                for key, req, lim in (("cpu", cpureq, cpulim), ("memory", memreq, memlim)):
                    if req:
                        requests[key] = req
                    if lim and lim != "0":
                        limits[key] = lim
            containers.append({"name": f"{name}c{i}", "requests": requests, "limits": limits})
        doc = {"name": name, "namespace": namespace, "containers": containers, "annotations": annotations or {},
               "labels": labels or {}}
        self.serial += 1  # pod UIDs never repeat, though names do after a reset
        pod = _pod(doc, 1000 + self.serial)
        try:
            self.sim.create(*pod)
        except SimulationError as err:  # a refusal is a check: expected, or a miss
            self.sim.placed = [p for p in self.sim.placed if p[0].id != pod[0].id]
            for c in pod[1]:
                if c.key in self.sim.ledger.containers:
                    self.sim.ledger.remove(c)
            self.checks.append(Check(self.scenario, f"{name} is {'refused' if fail else 'placed'}", fail, str(err)))
            return name
        if fail:
            self.checks.append(Check(self.scenario, f"{name} is refused", False, "it was placed"))
        return name

    def reset(self) -> None:
        """Pod names start from pod0 again (the stories reset their counter)."""
        self.count = 0

    def delete(self, *names: str) -> None:
        for name in names:
            self.sim.delete(name)

    def delete_all(self, namespace: str | None = None) -> None:
        for pod, _ in list(self.sim.placed):
            if namespace is None or pod.namespace == namespace:
                self.sim.delete(f"{pod.namespace}/{pod.name}")

    def reconfigure(self, config: str) -> None:
        self.sim.reconfigure(validate(yaml.safe_load(config), self.scenario))

    def refuses(self, config: str) -> None:
        """A check: the policy does not start with this configuration."""
        try:
            Simulation(self.topology, validate(yaml.safe_load(config), self.scenario))
        except (SimulationError, ConfigError) as err:
            self.checks.append(Check(self.scenario, "a configuration is refused", True, str(err)))
            return
        self.checks.append(Check(self.scenario, "a configuration is refused", False, "it was taken"))

    def restart(self, config: str) -> None:
        """The policy started afresh with a configuration, every pod gone (a new test's start)."""
        self.sim = Simulation(self.topology, validate(yaml.safe_load(config), self.scenario))

    def verify(self, *expressions: str) -> None:
        names = self._placement()
        for expr in expressions:
            try:
                # One namespace: comprehensions in a check see the placement too.
                held = bool(eval(expr, {"apart": apart, **self.constants, **names}))  # noqa: S307
                self.checks.append(Check(self.scenario, expr, held))
            except Exception as err:  # a check about a container that is not there is a miss
                self.checks.append(Check(self.scenario, expr, False, f"{type(err).__name__}: {err}"))

    # -- what a check sees --------------------------------------------------------------------
    def _placement(self) -> dict[str, Any]:
        topo = self.topology
        out: dict[str, Any] = {k: {} for k in ("cpus", "mems", "nodes", "packages", "dies", "cores", "pool")}
        pools = self.sim.policy.describe_pools()
        # A balloon's type by instance count, and each pool's CPU class (balloons' metrics show them).
        out["instances"] = {}
        for p in pools:
            kind = p["name"].split("[", 1)[0]
            out["instances"][kind] = out["instances"].get(kind, 0) + 1
        out["cpu_class"] = {p["name"]: p.get("cpu_class", "") for p in pools}
        for _, containers in self.sim.placed:
            for c in containers:
                res = self.sim.ledger.containers[c.key].resources
                cpus = set(CPUSet.parse(res.cpuset_cpus)) if res.cpuset_cpus else set(topo.online)
                out["cpus"][c.name] = cpus
                out["mems"][c.name] = set(CPUSet.parse(res.cpuset_mems)) if res.cpuset_mems else set(topo.nodes)
                out["nodes"][c.name] = {topo.cpus[i].node for i in cpus}
                out["packages"][c.name] = {topo.cpus[i].package for i in cpus}
                out["dies"][c.name] = {(topo.cpus[i].package, topo.cpus[i].die) for i in cpus}
                out["cores"][c.name] = {(topo.cpus[i].package, topo.cpus[i].die, topo.cpus[i].core) for i in cpus}
                out["pool"][c.name] = self.sim.policy.pool_of(c.key)
        return out


def outcome(replays: list[Replay]) -> tuple[int, int, list[Check]]:
    """(held, all, the misses) over every check of the replays."""
    checks = [c for r in replays for c in r.checks]
    misses = [c for c in checks if not c.held]
    return len(checks) - len(misses), len(checks), misses
