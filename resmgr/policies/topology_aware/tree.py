"""The pool tree of the topology-aware policy, built from the machine's topology.

Levels: a virtual root (only with several sockets), sockets, dies (only where a
socket has several and every NUMA node of it lies within one die), NUMA nodes (only
where the parent has several CPU-ful nodes: a lone child is folded into its parent),
and L3 cache domains (only where a node holds several, as core complexes do; they use
their node's memory). Memory-only nodes (PMEM, HBM), and DRAM nodes none of whose CPUs are
available, give their memory to the pool of the nearest CPU-ful node by distance.
A pool's CPUs and memory are the union of its children's plus what is attached to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from resmgr.policies.toolkit import claims
from resmgr.topology.cpuset import EMPTY, CPUSet
from resmgr.topology.model import MemoryType, Topology


@dataclass(eq=False)
class Pool:
    id: int  # breadth-first order: lower IDs are nearer the root
    name: str
    depth: int
    cpus: CPUSet  # every available CPU below this pool (isolated and reserved included)
    isolated: CPUSet
    reserved: CPUSet
    general: CPUSet  # cpus - isolated - reserved: what shared users and exclusive slices come from
    parent: Pool | None = None
    children: list[Pool] = field(default_factory=list)
    mems: dict[MemoryType, CPUSet] = field(default_factory=dict)  # NUMA node IDs by memory type
    memory: dict[MemoryType, int] = field(default_factory=dict)  # bytes by memory type
    ancestors: tuple[Pool, ...] = ()  # self first, then up to the root
    subtree: tuple[Pool, ...] = ()  # self and every descendant

    @property
    def level(self) -> int:
        """How wide the pool is, as nri-plugins' CPU topology levels count: 0 the whole system,
        1 a package (socket), 2 a die, 3 a NUMA node, 4 an L3 cache domain."""
        kind = self.name.split(" ", 1)[0]
        return {"root": 0, "socket": 1, "die": 2, "NUMA": 3, "L3": 4}[kind]

    def mems_of(self, types: Iterable[MemoryType]) -> CPUSet:
        out = EMPTY
        for t in types:
            out |= self.mems.get(t, EMPTY)
        return out

    def memory_of(self, types: Iterable[MemoryType]) -> int:
        return sum(self.memory.get(t, 0) for t in types)

    @property
    def all_mems(self) -> CPUSet:
        return self.mems_of(self.mems)

    def overlap(self, other: Pool) -> float:
        """How close two pools are: shared CPUs over all their CPUs (1: same pool, 0: disjoint)."""
        both = len(self.cpus | other.cpus)
        return len(self.cpus & other.cpus) / both if both else 0.0


class TreeError(Exception):
    pass


def build(topology: Topology, available: CPUSet, isolated: CPUSet, reserved: CPUSet) -> list[Pool]:
    """The pools, root first, in breadth-first order."""
    if not available:
        raise TreeError("no available CPUs to build pools from")
    cpus = {i: topology.cpus[i] for i in available}
    node_cpus: dict[int, CPUSet] = {}
    for c in cpus.values():
        if c.node >= 0:
            node_cpus[c.node] = node_cpus.get(c.node, EMPTY) | CPUSet((c.id,))
    node_package = {n: {cpus[i].package for i in s} for n, s in node_cpus.items()}
    packages = sorted({c.package for c in cpus.values()})
    pools: list[Pool] = []

    def make(name: str, members: CPUSet, parent: Pool | None) -> Pool:
        pool = Pool(len(pools), name, parent.depth + 1 if parent else 0, members, members & isolated,
                    members & reserved, members - isolated - reserved, parent)
        if parent is not None:
            parent.children.append(pool)
        pools.append(pool)
        return pool

    def leaves_for(parent: Pool, nodes: list[int]) -> None:
        if len(nodes) >= 2:
            for n in nodes:
                make(f"NUMA node #{n}", node_cpus[n], parent)

    # Breadth-first: create each level fully before the next, so IDs grow with depth.
    if any(len(p) > 1 for p in node_package.values()):
        # A NUMA node spanning sockets cannot nest under a socket: pool by node only.
        root = make("root", available, None)
        leaves_for(root, sorted(node_cpus))
    else:
        pkg_cpus = {p: CPUSet(i for i, c in cpus.items() if c.package == p) for p in packages}
        if len(packages) > 1:
            root = make("root", available, None)
            sockets = [make(f"socket #{p}", pkg_cpus[p], root) for p in packages]
        else:
            sockets = [make(f"socket #{packages[0]}", pkg_cpus[packages[0]], None)]
        next_level: list[tuple[Pool, list[int]]] = []
        die_level: list[tuple[Pool, list[int]]] = []
        for sock, p in zip(sockets, packages, strict=True):
            nodes = sorted(n for n, pk in node_package.items() if pk == {p})
            dies = sorted({c.die for c in cpus.values() if c.package == p})
            node_dies = {n: {cpus[i].die for i in node_cpus[n]} for n in nodes}
            if len(dies) >= 2 and all(len(d) == 1 for d in node_dies.values()):
                for d in dies:
                    die_cpus = CPUSet(i for i, c in cpus.items() if c.package == p and c.die == d)
                    die = make(f"die #{p}/{d}", die_cpus, sock)
                    die_level.append((die, [n for n in nodes if node_dies[n] == {d}]))
            else:
                next_level.append((sock, nodes))
        for parent, nodes in next_level + die_level:
            leaves_for(parent, nodes)
    _link(pools)
    _attach_memory(topology, pools, node_cpus)
    for pool in reversed(pools):  # children before parents
        if pool.parent is not None:
            for t, ids in pool.mems.items():
                pool.parent.mems[t] = pool.parent.mems.get(t, EMPTY) | ids
                pool.parent.memory[t] = pool.parent.memory.get(t, 0) + pool.memory[t]
    # L3 leaves where a node-level pool holds several L3 domains (core complexes). They use
    # their node's memory: the node's own accounting bounds what all of them take.
    for leaf in [p for p in pools if not p.children]:
        domains = sorted({topology.l3_of[c] & available for c in leaf.cpus}, key=lambda g: g.bits)
        if len(domains) < 2 or not all(d <= leaf.cpus for d in domains):
            continue
        for d in domains:
            cache = next((c for c in topology.caches if c.level == 3 and c.cpus & available == d), None)
            pool = make(f"L3 cache #{cache.id if cache is not None else min(d)}", d, leaf)
            pool.mems, pool.memory = dict(leaf.mems), dict(leaf.memory)
    _link(pools)
    return pools


def _link(pools: list[Pool]) -> None:
    for pool in pools:
        chain, p = [], pool
        while p is not None:
            chain.append(p)
            p = p.parent
        pool.ancestors = tuple(chain)
    for pool in reversed(pools):
        pool.subtree = (pool,) + tuple(q for child in pool.children for q in child.subtree)


def owner(pools: list[Pool], cpus: CPUSet) -> Pool:
    """The deepest pool holding all of cpus."""
    best = pools[0]
    for pool in pools:
        if cpus <= pool.cpus and pool.depth > best.depth:
            best = pool
    return best


def _attach_memory(topology: Topology, pools: list[Pool], node_cpus: dict[int, CPUSet]) -> None:
    """Give each memory node's memory to a pool (before inner pools sum their children's)."""
    cpu_nodes = sorted(node_cpus)
    for node in topology.nodes.values():
        if not node.memory:
            continue
        if node.id in node_cpus:
            home = owner(pools, node_cpus[node.id])
        else:
            near = [n for n in cpu_nodes if n in node.distances]
            # Nearest CPU-ful node by distance; ties go to the lower node ID.
            home = owner(pools, node_cpus[min(near, key=lambda n: (node.distances[n], n))]) if near \
                else pools[0]
        home.mems[node.kind] = home.mems.get(node.kind, EMPTY) | CPUSet((node.id,))
        home.memory[node.kind] = home.memory.get(node.kind, 0) + node.memory


def devices(topology: Topology, pools: list[Pool]) -> dict[str, tuple[Pool, claims.Attributes]]:
    """The DRA devices of the tree, by name: one per NUMA node with CPUs (the deepest pool holding
    them: its own, or its socket's where it is the socket's only node) and one per L3 pool. Each
    carries the standard numaNode attribute beside ours (a list for an L3 pool spanning nodes)."""
    out: dict[str, tuple[Pool, claims.Attributes]] = {}
    root_cpus = pools[0].cpus
    for node in sorted(topology.nodes.values(), key=lambda n: n.id):
        cpus = node.cpus & root_cpus
        if not cpus:
            continue
        out[f"numa-{node.id}"] = (owner(pools, cpus), {"kind": "numa", **claims.numa_attributes(topology, cpus)})
    for pool in pools:
        if pool.level == 4:  # "L3 cache #<id>"
            first = topology.cpus[min(pool.cpus)]
            cache = int(pool.name.rsplit("#", 1)[1])
            attrs: claims.Attributes = {"kind": "l3", "l3Cache": cache, "numaNode": first.node,
                                           "package": first.package}
            attrs[claims.NUMA_NODE] = claims.numa_attributes(topology, pool.cpus)[claims.NUMA_NODE]
            out[f"l3-{cache}"] = (pool, attrs)
    return out
