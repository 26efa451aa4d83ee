"""`cri-resmgr simulate`: run a policy over a list of pods without any runtime.

Pods come from a YAML list; each is turned into what kubelet would send over CRI
(cgroup parent by QoS class, CPU shares from the request, CFS quota from the limit,
the memory limit), handed to the policy in order, and every container's final
placement is printed.

    cri-resmgr simulate --machine sockets=2,nodes=2,cores=14,threads=2 \\
        --config policy.yaml --pods pods.yaml [--output json] [--html picture.html]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import yaml

from resmgr import policies
from resmgr.app.text import columns
from resmgr.config import Config, ConfigError, load_file
from resmgr.control import cgroupcpus
from resmgr.engine.ledger import Ledger
from resmgr.model import Container, ContainerState, Pod, QOSClass, Resources
from resmgr.options import add_to, from_args, opt
from resmgr.policies import PolicyError
from resmgr.policies.base import Policy
from resmgr.requests import RequirementError, milli_to_shares, parse_cpu, parse_memory
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


def load_pods(doc: Any) -> list[tuple[Pod, list[Container]]]:
    if not isinstance(doc, list):
        raise SimulationError("pods file: expected a YAML list of pods")
    out = []
    for i, p in enumerate(doc):
        if not isinstance(p, dict) or "name" not in p:
            raise SimulationError(f"pods file: entry {i} needs at least a name")
        name, ns = str(p["name"]), str(p.get("namespace", "default"))
        ctrs = p.get("containers") or [{"name": name}]
        qos = QOSClass(p["qos"]) if "qos" in p else _qos(ctrs)
        uid = f"uid-{i}"
        parent = {QOSClass.GUARANTEED: f"/kubepods/pod{uid}",
                  QOSClass.BURSTABLE: f"/kubepods/burstable/pod{uid}",
                  QOSClass.BEST_EFFORT: f"/kubepods/besteffort/pod{uid}"}[qos]
        pod = Pod(id=f"pod-{i}", uid=uid, name=name, namespace=ns, qos_class=qos, cgroup_parent=parent,
                  annotations={str(k): str(v) for k, v in (p.get("annotations") or {}).items()})
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
                id=f"{pod.id}-{cname}", pod_id=pod.id, name=cname, state=ContainerState.RUNNING,
                annotations={str(k): str(v) for k, v in (c.get("annotations") or {}).items()},
                requested=res, resources=res, hints=_hints(c.get("devices"), where)))
        out.append((pod, containers))
    return out


def run(topology: Topology, config: Config, pods: list[tuple[Pod, list[Container]]],
        cgroup_root: str = "/sys/fs/cgroup") -> dict[str, Any]:
    return summary(topology, *place(topology, config, pods, cgroup_root), pods)


def place(topology: Topology, config: Config, pods: list[tuple[Pod, list[Container]]],
          cgroup_root: str = "/sys/fs/cgroup") -> tuple[Policy, Ledger]:
    """The policy, and the ledger after every container of pods was placed in order."""
    try:
        section = cgroupcpus.resolve(config.data["policy"], cgroup_root)
        policy = policies.create(config.policy_name, section, topology)
    except (PolicyError, ConfigError) as err:
        raise SimulationError(f"policy {config.policy_name}: {err}") from None
    ledger = Ledger(policy)
    for pod, containers in pods:
        if pod.id not in ledger.pods:
            ledger.add_pod(pod)
        for c in containers:
            try:
                ledger.record(ledger.place(c, pod).updates)
            except PolicyError as err:
                who = f"{pod.namespace}/{pod.name}/{c.name}"
                raise SimulationError(str(err) if who in str(err) else f"container {who}: {err}") from None
    return policy, ledger


def summary(topology: Topology, policy: Policy, ledger: Ledger,
            pods: list[tuple[Pod, list[Container]]]) -> dict[str, Any]:
    pools = policy.describe_pools()
    result = []
    for pod, containers in pods:
        for c in containers:
            pool = policy.pool_of(c.key)
            result.append({"pod": f"{pod.namespace}/{pod.name}", "name": c.name,
                           "cpus": c.resources.cpuset_cpus or str(topology.online),
                           "mems": c.resources.cpuset_mems, "rdt_class": c.classes.get("rdt", ""),
                           "blockio_class": c.classes.get("blockio", ""), "pool": pool})
    return {"policy": policy.name, "pools": pools, "containers": result, "notices": policy.fallback()}


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
                            "numbering=linear, ecores=N,ecluster=N (hybrid), l3=N (cores per L3 domain)")
    config: str = opt("", "--config", metavar="FILE", help="YAML configuration (policy section); default: none policy")
    pods: str = opt("", "--pods", metavar="FILE", required=True, help="YAML list of pods to place, in order")
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
        if args.machine:
            root = tempfile.mkdtemp(prefix="crirm-machine-")
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
        pods = load_pods(doc)
        policy, ledger = place(topology, config, pods, os.path.join(args.host_root or "/", "sys/fs/cgroup"))
        result = summary(topology, policy, ledger, pods)
        if args.html:
            described = {"source": f"simulated: {args.config or 'built-in defaults'}", "policy": policy.name,
                         "generation": 0, "last_error": "", "yaml": config.to_yaml()}
            picture = standalone(statedoc.build(topology, policy, ledger.pods, ledger.containers, described))
            try:
                with open(args.html, "w", encoding="utf-8") as f:
                    f.write(picture)
            except OSError as err:
                raise SimulationError(f"--html {args.html}: {err}") from None
    except (SimulationError, ConfigError, TopologyError) as err:
        print(f"cri-resmgr simulate: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.output == "json" else table(result))
    return 0
