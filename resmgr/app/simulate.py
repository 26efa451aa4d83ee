"""`cri-resmgr simulate`: run a policy over a list of pods without any runtime.

Pods come from a YAML list; each is turned into what kubelet would send over CRI
(cgroup parent by QoS class, CPU shares from the request, CFS quota from the limit,
the memory limit), handed to the policy in order, and every container's final
placement is printed. Between pods the list may hold steps that tell a placement
story without a runtime:

    - {delete: [web, default/db]}       # pods removed, their CPUs given back
    - {config: {policy: {Active: ...}}}  # a new configuration, applied as the daemon does

With steps in the list, --output json adds `steps`: the placement after each entry.

    cri-resmgr simulate --machine sockets=2,nodes=2,cores=14,threads=2 \\
        --config policy.yaml --pods pods.yaml [--output json] [--html picture.html]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import yaml

from resmgr import policies
from resmgr.app.text import columns
from resmgr.config import Config, ConfigError, load_file, validate
from resmgr.control import cgroupcpus
from resmgr.engine.ledger import Ledger
from resmgr.model import Container, ContainerState, Pod, QOSClass, Resources
from resmgr.options import add_to, from_args, opt
from resmgr.policies import PolicyError
from resmgr.policies.base import Policy
from resmgr.requests import RESOURCES_ANNOTATION, RequirementError, milli_to_shares, parse_cpu, parse_memory
from resmgr.topology.generate import generate, parse_spec
from resmgr.topology.model import Topology
from resmgr.topology.sysfs import TopologyError, discover
from resmgr.view import state as statedoc
from resmgr.view.html import standalone


class SimulationError(Exception):
    pass


def _quantities(spec: dict[str, Any], where: str) -> tuple[int, int]:
    try:
        cpu = parse_cpu(spec["cpu"]) if "cpu" in spec else 0
        mem = parse_memory(spec["memory"]) if "memory" in spec else 0
    except RequirementError as err:
        raise SimulationError(f"{where}: {err}") from None
    return cpu, mem


def _hints(devices: Any, where: str) -> dict[str, list[int]]:
    """`devices: {/dev/x: [NUMA nodes]}`: the topology hints a real device would give."""
    if not devices:
        return {}
    try:
        return {str(dev): [int(n) for n in nodes] for dev, nodes in devices.items()}
    except (AttributeError, TypeError, ValueError):
        raise SimulationError(f"{where}: devices: expected a mapping of device path to a list of NUMA "
                              "nodes") from None


def _qos(containers: list[dict[str, Any]]) -> QOSClass:
    """kubelet's rule: all limits equal requests -> Guaranteed; nothing set -> BestEffort."""
    any_set, guaranteed = False, True
    for c in containers:
        requests, limits = c.get("requests") or {}, c.get("limits") or {}
        any_set = any_set or bool(requests) or bool(limits)
        for res in ("cpu", "memory"):
            if res not in limits or requests.get(res, limits[res]) != limits[res]:
                guaranteed = False
    if not any_set:
        return QOSClass.BEST_EFFORT
    return QOSClass.GUARANTEED if guaranteed else QOSClass.BURSTABLE


Placed = tuple[Pod, list[Container]]


@dataclass
class Step:
    """One entry of the pods file: a pod to create, pods to delete, or a new configuration."""

    what: str
    create: Placed | None = None
    delete: tuple[str, ...] = ()
    config: Config | None = None


def load_steps(doc: Any) -> list[Step]:
    if not isinstance(doc, list):
        raise SimulationError("pods file: expected a YAML list of pods and steps")
    steps = []
    for i, entry in enumerate(doc):
        where = f"pods file: entry {i}"
        if isinstance(entry, dict) and set(entry) == {"delete"}:
            names = entry["delete"]
            names = [names] if isinstance(names, str) else names
            if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
                raise SimulationError(f"{where}: delete: expected a pod name or a list of them")
            steps.append(Step(f"delete {', '.join(names)}", delete=tuple(names)))
        elif isinstance(entry, dict) and set(entry) == {"config"}:
            try:
                config = validate(entry["config"], f"{where}: config")
            except ConfigError as err:
                raise SimulationError(str(err)) from None
            steps.append(Step(f"config ({config.policy_name})", config=config))
        else:
            pod = _pod(entry, i)
            steps.append(Step(f"create {pod[0].namespace}/{pod[0].name}", create=pod))
    return steps


def load_pods(doc: Any) -> list[Placed]:
    """The pods of a pods file that holds pods only."""
    steps = load_steps(doc)
    if any(s.create is None for s in steps):
        raise SimulationError("pods file: expected pods only here")
    return [s.create for s in steps if s.create is not None]


def _pod(p: Any, i: int) -> Placed:
    if not isinstance(p, dict) or "name" not in p:
        raise SimulationError(f"pods file: entry {i} needs at least a name (or is a delete or config step)")
    name, ns = str(p["name"]), str(p.get("namespace", "default"))
    ctrs = p.get("containers") or [{"name": name}]
    qos = QOSClass(p["qos"]) if "qos" in p else _qos(ctrs)
    uid = f"uid-{i}"
    parent = {QOSClass.GUARANTEED: f"/kubepods/pod{uid}",
              QOSClass.BURSTABLE: f"/kubepods/burstable/pod{uid}",
              QOSClass.BEST_EFFORT: f"/kubepods/besteffort/pod{uid}"}[qos]
    pod = Pod(id=f"pod-{i}", uid=uid, name=name, namespace=ns, qos_class=qos, cgroup_parent=parent,
              labels={str(k): str(v) for k, v in (p.get("labels") or {}).items()},
              annotations={str(k): str(v) for k, v in (p.get("annotations") or {}).items()})
    # What the webhook annotates: each container's requests and limits, memory requests included,
    # which CRI does not carry.
    pod.annotations.setdefault(RESOURCES_ANNOTATION, json.dumps(
        {str(c.get("name", f"c{j}")): {"requests": c.get("requests") or {}, "limits": c.get("limits") or {}}
         for j, c in enumerate(ctrs) if isinstance(c, dict)}))
    containers = []
    for j, c in enumerate(ctrs):
        cname = str(c.get("name", f"c{j}"))
        where = f"pod {ns}/{name} container {cname}"
        req_cpu, req_mem = _quantities(c.get("requests") or {}, where)
        lim_cpu, lim_mem = _quantities(c.get("limits") or {}, where)
        if qos == QOSClass.GUARANTEED:
            req_cpu = req_cpu or lim_cpu
        res = Resources(cpu_shares=milli_to_shares(req_cpu), cpu_period=100000,
                        cpu_quota=lim_cpu * 100 if lim_cpu else 0, memory_limit_in_bytes=lim_mem)
        containers.append(Container(
            id=f"{pod.id}-{cname}", pod_id=pod.id, name=cname, state=ContainerState.PENDING,
            annotations={str(k): str(v) for k, v in (c.get("annotations") or {}).items()},
            requested=res, resources=res, hints=_hints(c.get("devices"), where)))
    return pod, containers


def _policy(topology: Topology, config: Config, cgroup_root: str) -> Policy:
    try:
        return policies.create(config.policy_name, _section(config, cgroup_root), topology)
    except PolicyError as err:
        raise SimulationError(f"policy {config.policy_name}: {err}") from None


def _section(config: Config, cgroup_root: str) -> dict[str, Any]:
    try:
        return cgroupcpus.resolve(config.data["policy"], cgroup_root)
    except ConfigError as err:
        raise SimulationError(f"policy {config.policy_name}: {err}") from None


class Simulation:
    """A policy and its ledger, driven step by step as the daemon would drive them."""

    def __init__(self, topology: Topology, config: Config, cgroup_root: str = "/sys/fs/cgroup") -> None:
        self.topology, self.config, self.cgroup_root = topology, config, cgroup_root
        self.ledger = Ledger(_policy(topology, config, cgroup_root))
        self.placed: list[Placed] = []  # live pods in the order they came

    @property
    def policy(self) -> Policy:
        return self.ledger.policy

    def step(self, step: Step) -> None:
        if step.create is not None:
            self.create(*step.create)
        elif step.config is not None:
            self.reconfigure(step.config)
        else:
            for name in step.delete:
                self.delete(name)

    def create(self, pod: Pod, containers: list[Container]) -> None:
        if pod.id not in self.ledger.pods:
            self.ledger.add_pod(pod)
        self.placed.append((pod, containers))
        for c in containers:  # created, then started, as the runtime does
            try:
                self.ledger.record(self.ledger.place(c, pod).updates)
            except PolicyError as err:
                who = f"{pod.namespace}/{pod.name}/{c.name}"
                raise SimulationError(str(err) if who in str(err) else f"container {who}: {err}") from None
            self.ledger.started(c)

    def delete(self, name: str) -> None:
        ns, _, plain = name.rpartition("/")
        found = [(p, cs) for p, cs in self.placed if p.name == plain and p.namespace == (ns or p.namespace)]
        if not found:
            raise SimulationError(f"delete {name}: no such pod (live: "
                                  f"{', '.join(f'{p.namespace}/{p.name}' for p, _ in self.placed) or 'none'})")
        if len(found) > 1:
            raise SimulationError(f"delete {name}: several pods of that name; write namespace/name")
        pod, containers = found[0]
        for c in containers:
            self.ledger.remove(c)
        self.placed.remove(found[0])

    def reconfigure(self, config: Config) -> None:
        """As the daemon applies a new configuration: in place if the policy can keep its grants,
        else a new instance that places every container again."""
        section = _section(config, self.cgroup_root)
        try:
            if config.policy_name == self.policy.name:
                try:
                    self.ledger.record(self.policy.reconfigure(section, self.ledger.view()).updates)
                    self.config = config
                    return
                except NotImplementedError:
                    pass
            self.ledger.record(self.ledger.reallocate(policies.create(config.policy_name, section, self.topology)))
        except PolicyError as err:
            raise SimulationError(f"config: policy {config.policy_name}: {err}") from None
        self.config = config

    def summary(self) -> dict[str, Any]:
        policy = self.policy
        result = []
        for pod, containers in self.placed:
            for c in containers:
                c = self.ledger.containers[c.key]
                result.append({"pod": f"{pod.namespace}/{pod.name}", "name": c.name,
                               "cpus": c.resources.cpuset_cpus or str(self.topology.online),
                               "mems": c.resources.cpuset_mems, "rdt_class": c.classes.get("rdt", ""),
                               "blockio_class": c.classes.get("blockio", ""), "pool": policy.pool_of(c.key)})
        return {"policy": policy.name, "pools": policy.describe_pools(), "containers": result,
                "notices": policy.fallback()}


def run(topology: Topology, config: Config, steps: list[Step], cgroup_root: str = "/sys/fs/cgroup",
        each: bool = False) -> tuple[Simulation, dict[str, Any]]:
    """Play the steps; the simulation and its summary (with each: `steps`, the summary after each)."""
    sim = Simulation(topology, config, cgroup_root)
    after = []
    for step in steps:
        sim.step(step)
        if each:
            after.append({"step": step.what, **sim.summary()})
    result = sim.summary()
    if each:
        result["steps"] = after
    return sim, result


def table(result: dict[str, Any]) -> str:
    lines = [f"policy: {result['policy']}"]
    for p in result["pools"]:
        extra = "".join(f", {k} {p[k] or '-'}" for k in ("mems", "shared", "isolated") if k in p)
        lines.append(f"pool {p['name']}: cpus {p['cpus'] or '-'}{extra}")
    lines += [f"note: {n}" for n in result.get("notices", [])]
    rows = [("POD", "CONTAINER", "POOL", "CPUS", "MEMS", "RDT", "BLOCKIO")]
    rows += [(c["pod"], c["name"], c["pool"] or "-", c["cpus"] or "-", c["mems"] or "-", c["rdt_class"] or "-",
              c["blockio_class"] or "-") for c in result["containers"]]
    lines += columns(rows)
    return "\n".join(lines)


MACHINE = "the machine (one of)"


@dataclass
class SimulateOptions:
    host_root: str = opt("", "--host-root", group=MACHINE, exclusive="machine", metavar="DIR",
                         help="read the topology from DIR/sys (default: /)")
    machine: str = opt("", "--machine", group=MACHINE, exclusive="machine", metavar="SPEC",
                       help="generate a machine: sockets=N,dies=N,nodes=N,cores=N,threads=N,mem=SIZE,"
                            "pmem=NxSIZE,hbm=NxSIZE,isolated=LIST,offline=LIST (';' separates list items), "
                            "numbering=linear, ecores=N,ecluster=N (hybrid), l3=N (cores per L3 domain), "
                            "l2=N (cores per L2 cluster)")
    config: str = opt("", "--config", metavar="FILE", help="YAML configuration (policy section); default: none policy")
    pods: str = opt("", "--pods", metavar="FILE", required=True,
                    help="YAML list of pods to place, in order, and of steps ({delete: [names]}, {config: {...}})")
    output: str = opt("table", "--output", choices=["table", "json"], help="(default: %(default)s)")
    html: str = opt("", "--html", metavar="FILE",
                    help="also write the placement as the node picture the daemon serves (one self-contained "
                         "HTML file, opened in any browser)")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="cri-resmgr simulate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to(ap, SimulateOptions)
    args = from_args(SimulateOptions, ap.parse_args(argv))
    try:
        return _simulate(args)
    except (SimulationError, ConfigError, TopologyError) as err:
        print(f"cri-resmgr simulate: {err}", file=sys.stderr)
        return 1


def _simulate(args: SimulateOptions) -> int:
    # A generated machine lives only as long as the simulation reads it.
    with tempfile.TemporaryDirectory(prefix="crirm-machine-") if args.machine else contextlib.nullcontext() as made:
        if made:
            root = made
            try:
                generate(parse_spec(args.machine), root)
            except ValueError as err:
                raise SimulationError(f"--machine: {err}") from None
        else:
            root = args.host_root or "/"
        topology = discover(root)
        config = load_file(args.config) if args.config else Config()
        try:
            with open(args.pods, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
        except (OSError, yaml.YAMLError, UnicodeDecodeError, RecursionError) as err:
            raise SimulationError(f"pods file {args.pods}: {err}") from None
        steps = load_steps(doc)
        story = any(s.create is None for s in steps)  # with steps: the placement after each, in JSON
        sim, result = run(topology, config, steps, os.path.join(args.host_root or "/", "sys/fs/cgroup"),
                          each=story and args.output == "json")
        if args.html:
            described = {"source": f"simulated: {args.config or 'built-in defaults'}", "policy": sim.policy.name,
                         "generation": 0, "last_error": "", "yaml": sim.config.to_yaml()}
            picture = standalone(statedoc.build(topology, sim.policy, sim.ledger.pods, sim.ledger.containers,
                                                described))
            try:
                with open(args.html, "w", encoding="utf-8") as f:
                    f.write(picture)
            except OSError as err:
                raise SimulationError(f"--html {args.html}: {err}") from None
    print(json.dumps(result, indent=2) if args.output == "json" else table(result))
    return 0
