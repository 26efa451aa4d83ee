"""The node as a NodeResourceTopology (topology.node.k8s.io/v1alpha2): zones and what is left.

Built from the state document (resmgr/view/state.py), the same one `cri-resmgr status`
prints, so the two always agree. Zones:

- one per NUMA node, type `Node` (the type the topology-aware scheduler plugin reads),
  named `node-<id>`, with its NUMA distances as costs. cpu: capacity is its online CPUs,
  allocatable leaves out the reserved ones, available leaves out what containers hold
  (exclusive CPUs whole, shared requests spread over the CPUs they run on). memory:
  capacity and allocatable are the node's memory, available leaves out the memory limits
  of the containers pinned to it (spread over their memory nodes).
- one per policy pool (type `Pool`, or `Balloon` for balloons), named as in
  `cri-resmgr status`, with its parent pool: cpu capacity is its CPUs, available its
  free shared milli-CPU; attributes carry its CPU set, memory nodes and counts.
"""

from __future__ import annotations

from typing import Any

from resmgr.topology.cpuset import CPUSet

ACTIVE = ("created", "running", "pending")


def cpu_quantity(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _resource(name: str, capacity: str, allocatable: str, available: str) -> dict[str, str]:
    return {"name": name, "capacity": capacity, "allocatable": allocatable, "available": available}


def _attrs(**values: object) -> list[dict[str, str]]:
    return [{"name": k.replace("_", "-"), "value": str(v)} for k, v in values.items()]


def node_zones(doc: dict[str, Any]) -> list[dict[str, Any]]:
    topo = doc["topology"]
    online = CPUSet.parse_or_empty(topo.get("online", ""))
    all_nodes = [int(n["id"]) for n in topo["nodes"]]
    roles: dict[int, dict[str, int]] = {}
    for cpu in doc["cpus"]:
        by = roles.setdefault(int(cpu["node"]), {})
        by[cpu["role"]] = by.get(cpu["role"], 0) + 1
    active = [c for pod in doc["pods"] for c in pod["containers"] if c["state"] in ACTIVE]
    zones = []
    for n in topo["nodes"]:
        nid = int(n["id"])
        cpus = CPUSet.parse_or_empty(n["cpus"]) & online
        held = roles.get(nid, {})
        allocatable = len(cpus) - held.get("reserved", 0)
        shared = 0.0
        memory_used = 0.0
        for c in active:
            runs_on = CPUSet.parse_or_empty(c["runs_on"])
            if c.get("shared_milli") and runs_on:
                shared += c["shared_milli"] * len(runs_on & cpus) / len(runs_on)
            mems = list(CPUSet.parse_or_empty(c.get("mems") or "")) or all_nodes
            if c.get("memory_limit") and nid in mems:
                memory_used += c["memory_limit"] / len(mems)
        free_milli = max(0, (allocatable - held.get("exclusive", 0)) * 1000 - round(shared))
        memory = int(n["memory"])
        resources = []
        if cpus:
            resources.append(_resource("cpu", str(len(cpus)), str(allocatable), cpu_quantity(free_milli)))
        if memory:
            resources.append(_resource("memory", str(memory), str(memory), str(max(0, memory - round(memory_used)))))
        zones.append({"name": f"node-{nid}", "type": "Node",
                      "costs": [{"name": f"node-{k}", "value": int(v)} for k, v in n["distances"].items()],
                      "attributes": _attrs(cpus=n["cpus"] or "-", memory_type=n["kind"]),
                      "resources": resources})
    return zones


def pool_zones(doc: dict[str, Any], taken: set[str]) -> list[dict[str, Any]]:
    kind = "Balloon" if doc["policy"] == "balloons" else "Pool"
    zones = []
    for p in doc["pools"]:
        st = p["stats"]
        name = p["name"] if p["name"] not in taken else f"pool-{p['name']}"
        zone: dict[str, Any] = {
            "name": name, "type": kind,
            "attributes": _attrs(cpus=p["cpus"] or "-", shared=p.get("shared") or "-", mems=p.get("mems") or "-",
                                 exclusive_grants=st["exclusive_grants"], containers=st["containers"],
                                 shared_milli_requested=st["shared_milli_requested"]),
            "resources": [_resource("cpu", str(st["cpus"]), str(st["cpus"]),
                                    cpu_quantity(max(0, st["shared_milli_free"])))],
        }
        if p.get("parent"):
            zone["parent"] = p["parent"]
        zones.append(zone)
    return zones


def alignment(policy: str) -> tuple[str, str]:
    """(topologyManagerPolicy, topologyManagerScope): the NUMA alignment the policy gives, in the
    terms of kubelet's topology manager the scheduler plugin filters nodes by. topology-aware puts a
    container that fits one NUMA node on one (single-numa-node, per container); the others promise
    none, so the plugin does not filter their nodes."""
    return ("single-numa-node", "container") if policy == "topology-aware" else ("none", "container")


def build(doc: dict[str, Any]) -> dict[str, Any]:
    """The NodeResourceTopology's zones and attributes (no metadata: the agent names it)."""
    nodes = node_zones(doc)
    tm_policy, tm_scope = alignment(doc["policy"])
    return {"zones": nodes + pool_zones(doc, {z["name"] for z in nodes}),
            "attributes": _attrs(resource_manager="cri-resmgr", policy=doc["policy"]) + [
                {"name": "topologyManagerPolicy", "value": tm_policy},
                {"name": "topologyManagerScope", "value": tm_scope}]}
