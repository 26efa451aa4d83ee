"""The node as one JSON document: topology, pools, pods and containers with their grants.

Served at /api/v1/state, drawn by the live picture, read by `cri-resmgr status` and
turned into pool gauges for Prometheus. Built from the engine's ledger and the policy's
own description, synchronously (no awaits), so it is one consistent moment of the state.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from resmgr.model import Claim, Container, Pod
from resmgr.policies.base import Policy
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import Topology

VERSION = 1
ROLES = ("exclusive", "reserved", "isolated", "shared", "free")


def topology_doc(topology: Topology | None) -> dict[str, Any]:
    """Sockets > dies > NUMA nodes > cores > CPUs, plus memory-only nodes."""
    if topology is None:
        return {"sockets": [], "memory_nodes": [], "online": "", "offline": "", "isolated": "", "nodes": []}
    sockets: dict[int, dict[tuple[int, int], dict[int, dict[int, list[int]]]]] = {}
    for cpu in sorted(topology.cpus.values(), key=lambda c: c.id):
        cores = sockets.setdefault(cpu.package, {}).setdefault((cpu.package, cpu.die), {}).setdefault(cpu.node, {})
        cores.setdefault(cpu.core, []).append(cpu.id)
    nodes = [{"id": n.id, "kind": n.kind.value, "memory": n.memory, "cpus": str(n.cpus),
              "distances": {str(k): v for k, v in sorted(n.distances.items())}} for n in topology.nodes.values()]
    return {
        "sockets": [{"id": pkg, "dies": [{"id": die, "nodes": [
            {"id": node, "cores": [{"id": core, "cpus": ids} for core, ids in sorted(cores.items())]}
            for node, cores in sorted(by_node.items())]} for (_, die), by_node in sorted(dies.items())]}
            for pkg, dies in sorted(sockets.items())],
        "memory_nodes": [n["id"] for n in nodes if not CPUSet.parse_or_empty(str(n["cpus"]))],
        "nodes": nodes, "online": str(topology.online), "offline": str(topology.offline),
        "isolated": str(topology.isolated),
    }


def _container_doc(c: Container, policy: Policy, online: CPUSet) -> dict[str, Any]:
    grant = policy.describe_grant(c.key) or {}
    return {"id": c.id, "key": c.key, "name": c.name, "state": c.state.value,
            "cpus": c.resources.cpuset_cpus, "mems": c.resources.cpuset_mems,
            # without a cpuset the container may run on any online CPU
            "runs_on": c.resources.cpuset_cpus or str(online),
            "pool": grant.get("pool", ""), "kind": grant.get("kind", ""), "fallback": grant.get("fallback", ""),
            "exclusive": grant.get("exclusive", ""), "shared_milli": grant.get("shared_milli", 0),
            "rdt_class": c.classes.get("rdt", ""), "blockio_class": c.classes.get("blockio", ""),
            "cpu_shares": c.resources.cpu_shares, "cpu_quota": c.resources.cpu_quota,
            "memory_limit": c.resources.memory_limit_in_bytes, "pending": c.pending}


def cpu_roles(topology: Topology | None, pools: list[dict[str, Any]],
              pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Who holds each online CPU: exclusive (one container), reserved, isolated (not granted),
    shared (containers run on it), or free (nobody does)."""
    if topology is None:
        return []
    reserved = isolated = EMPTY
    for p in pools:
        reserved |= CPUSet.parse_or_empty(p.get("reserved", ""))
        isolated |= CPUSet.parse_or_empty(p.get("isolated", ""))
    isolated |= topology.isolated
    owner: dict[int, str] = {}
    runs: dict[int, list[str]] = {}
    for pod in pods:
        for c in pod["containers"]:
            if c["state"] not in ("created", "running", "pending"):
                continue
            who = f"{pod['namespace']}/{pod['name']}/{c['name']}"
            for cpu in CPUSet.parse_or_empty(c["exclusive"]):
                owner[cpu] = who
            for cpu in CPUSet.parse_or_empty(c["runs_on"]):
                runs.setdefault(cpu, []).append(who)
    out = []
    for cpu in sorted(topology.cpus.values(), key=lambda c: c.id):
        holders = runs.get(cpu.id, [])
        if cpu.id in owner:
            role, holders = "exclusive", [owner[cpu.id]]
        elif cpu.id in reserved:
            role = "reserved"
        elif cpu.id in isolated:
            role = "isolated"
        else:
            role = "shared" if holders else "free"
        out.append({"id": cpu.id, "socket": cpu.package, "die": cpu.die, "node": cpu.node, "core": cpu.core,
                    "role": role, "holders": holders})
    return out


def _stats(p: Mapping[str, Any]) -> dict[str, int]:
    return {"cpus": len(CPUSet.parse_or_empty(p.get("cpus", ""))),
            "shared_cpus": len(CPUSet.parse_or_empty(p.get("shared", ""))),
            **{k: int(p.get(k, 0)) for k in ("exclusive_grants", "containers", "shared_milli_requested",
                                             "shared_milli_free", "shared_elsewhere")}}


def dra_doc(policy: Policy, claims: Mapping[str, Claim]) -> dict[str, Any]:
    """The DRA devices the policy offers (what the agent publishes) and the claims prepared on them."""
    return {"devices": policy.devices(),
            "claims": [{**c.to_dict(), **(policy.describe_claim(uid) or {}), "cpus_asked": c.cpus}
                       for uid, c in sorted(claims.items())]}


def build(topology: Topology | None, policy: Policy, pods: Mapping[str, Pod], containers: Mapping[str, Container],
          config: Mapping[str, Any] | None = None, topo: dict[str, Any] | None = None,
          claims: Mapping[str, Claim] | None = None) -> dict[str, Any]:
    """The document; topo: a topology_doc computed before (it never changes while running)."""
    online = topology.online if topology is not None else EMPTY
    pools = [{**p, "stats": _stats(p)} for p in policy.describe_pools()]
    by_pod: dict[str, list[dict[str, Any]]] = {}
    for c in sorted(containers.values(), key=lambda c: c.seq):
        by_pod.setdefault(c.pod_id, []).append(_container_doc(c, policy, online))
    pod_docs = [{"id": p.id, "uid": p.uid, "name": p.name, "namespace": p.namespace, "state": p.state.value,
                 "qos_class": p.qos_class.value, "containers": by_pod.get(p.id, [])}
                for p in sorted(pods.values(), key=lambda p: p.seq)]
    return {"version": VERSION, "time": time.time(), "policy": policy.name,
            "config": dict(config or {}),
            "topology": topo if topo is not None else topology_doc(topology),
            "pools": pools, "cpus": cpu_roles(topology, pools, pod_docs), "pods": pod_docs,
            "notices": [*(config or {}).get("problems", []), *policy.fallback()],
            "dra": dra_doc(policy, claims or {})}
