"""Write a synthetic sysfs tree that the discovery code reads like a real one.

For tests, and for users who want to see how a policy would place containers on a
machine they do not have. CPU numbering follows the kernel on Intel servers by default
(the first thread of every core, then the second), or `linear` (a core's threads
adjacent, common on desktops).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from resmgr.topology.cpuset import CPUSet

GiB = 1 << 30


@dataclass
class MemoryOnlyNode:
    kind: str  # "pmem" or "hbm" (only the size decides what discovery calls it)
    size: int
    socket: int = 0


@dataclass
class MachineSpec:
    sockets: int = 1
    dies: int = 1  # per socket
    nodes_per_die: int = 1
    cores_per_node: int = 4
    threads: int = 2
    memory_per_node: int = 16 * GiB
    memory_only: list[MemoryOnlyNode] = field(default_factory=list)
    isolated: str = ""
    offline: str = ""
    numbering: str = "interleaved"  # or "linear"
    cpufreq: bool = True
    caches: bool = True
    # A hybrid part: efficient cores per node (one thread each, numbered after every performance
    # core's CPUs, as Intel's are), in L2 clusters of ecluster cores.
    ecores: int = 0
    ecluster: int = 4
    # Performance (or only) cores per L3 domain within a node (core complexes, as on AMD EPYC);
    # 0: one L3 per die.
    l3: int = 0
    # Performance (or only) cores per L2 cache within a node (cache clusters, as on Arm servers and
    # in nri-plugins' cache-cluster tests); 0: an L2 per core.
    l2: int = 0

    @property
    def cpu_nodes(self) -> int:
        return self.sockets * self.dies * self.nodes_per_die

    @property
    def cores(self) -> int:
        return self.cpu_nodes * self.cores_per_node

    @property
    def cpus(self) -> int:
        """Performance (or only) cores' CPUs."""
        return self.cores * self.threads

    @property
    def all_cpus(self) -> int:
        return self.cpus + self.cpu_nodes * self.ecores


_SPEC_KEYS = {"sockets": "sockets", "dies": "dies", "nodes": "nodes_per_die", "cores": "cores_per_node",
              "threads": "threads", "ecores": "ecores", "ecluster": "ecluster", "l3": "l3", "l2": "l2"}


def parse_spec(text: str) -> MachineSpec:
    """'sockets=2,nodes=2,cores=14,threads=2,mem=96G,pmem=2x512G,hbm=..,isolated=..,offline=..';
    a hybrid desktop: 'cores=8,threads=2,ecores=8,ecluster=4,numbering=linear'; a server with four L3
    domains (core complexes) per NUMA node: 'sockets=2,cores=32,l3=8'; L2 clusters of 2 cores: 'l2=2'."""
    spec = MachineSpec()
    for item in filter(None, (s.strip() for s in re.split(r",(?=[a-z][a-z0-9]*=)", text))):
        key, _, value = item.partition("=")
        if key in _SPEC_KEYS:
            setattr(spec, _SPEC_KEYS[key], int(value))
        elif key == "mem":
            spec.memory_per_node = _size(value)
        elif key in ("pmem", "hbm"):
            count, _, size = value.partition("x") if "x" in value else ("1", "", value)
            for i in range(int(count)):
                spec.memory_only.append(MemoryOnlyNode(key, _size(size), i % max(spec.sockets, 1)))
        elif key in ("isolated", "offline"):
            setattr(spec, key, value.replace(";", ","))
        elif key == "numbering":
            spec.numbering = value
        else:
            raise ValueError(f"unknown machine spec key {key!r} in {text!r}")
    return spec


def _size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMGT]?)", text.strip().upper())
    if not m:
        raise ValueError(f"bad size {text!r} (use e.g. 64G)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2)]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def generate(spec: MachineSpec, root: str | Path) -> Path:
    """Write `<root>/sys/devices/system/{cpu,node}` for spec; returns root."""
    root = Path(root)
    system = root / "sys" / "devices" / "system"
    cpu_root, node_root = system / "cpu", system / "node"
    offline = CPUSet.parse(spec.offline)
    isolated = CPUSet.parse(spec.isolated)
    all_cpus = CPUSet(range(spec.all_cpus))
    online = all_cpus - offline

    # Lay out cores: global core index -> (socket, die, node, core_id within package); performance
    # (or only) cores first, then efficient ones.
    layout = []
    efficient: list[tuple[int, int, int, int]] = []
    for s in range(spec.sockets):
        core_in_pkg = 0
        for d in range(spec.dies):
            for n in range(spec.nodes_per_die):
                node = (s * spec.dies + d) * spec.nodes_per_die + n
                for _ in range(spec.cores_per_node):
                    layout.append((s, d, node, core_in_pkg))
                    core_in_pkg += 1
                for _ in range(spec.ecores):
                    efficient.append((s, d, node, 1000 + len(efficient)))  # core IDs apart from the others
    layout += efficient

    def cpu_id(core: int, thread: int) -> int:
        if core >= spec.cores:  # efficient: one thread each, after all the others
            return spec.cpus + core - spec.cores
        if spec.numbering == "linear":
            return core * spec.threads + thread
        return thread * spec.cores + core

    def threads(core: int) -> int:
        return 1 if core >= spec.cores else spec.threads

    siblings = {g: CPUSet(cpu_id(g, t) for t in range(threads(g))) for g in range(len(layout))}
    # L2: a core's own, its cluster of l2 cores in the same node, or its cluster of efficient cores.
    l2, l2_id = dict(siblings), {g: g for g in siblings}
    if spec.l2:
        for g in range(spec.cores):
            node_first = g - g % spec.cores_per_node
            first = node_first + (g - node_first) // spec.l2 * spec.l2
            last = min(first + spec.l2, node_first + spec.cores_per_node)
            l2[g], l2_id[g] = CPUSet(c for h in range(first, last) for c in siblings[h]), first
    for g in range(spec.cores, len(layout)):
        node_first = g - (g - spec.cores) % spec.ecores  # the node's first efficient core
        first = node_first + (g - node_first) // spec.ecluster * spec.ecluster
        last = min(first + spec.ecluster, node_first + spec.ecores)
        l2[g], l2_id[g] = CPUSet(cpu_id(h, 0) for h in range(first, last)), first
    def l3_domain(g: int, die_cpus: CPUSet, die_key: int) -> tuple[CPUSet, int]:
        """The CPUs sharing core g's L3 cache, and the cache's id."""
        if not spec.l3 or g >= spec.cores:
            return die_cpus, die_key
        first = g - g % spec.cores_per_node + (g % spec.cores_per_node) // spec.l3 * spec.l3
        last = min(first + spec.l3, g - g % spec.cores_per_node + spec.cores_per_node)
        return CPUSet(c for h in range(first, last) for c in siblings[h]), 1000 + first

    package_cpus = {s: CPUSet(c for g, (ss, *_) in enumerate(layout) if ss == s for c in siblings[g])
                    for s in range(spec.sockets)}
    node_cpus: dict[int, CPUSet] = {}
    for g, (_, _, node, _) in enumerate(layout):
        node_cpus[node] = node_cpus.get(node, CPUSet()) | siblings[g]

    _write(cpu_root / "online", str(online))
    _write(cpu_root / "possible", str(all_cpus))
    _write(cpu_root / "present", str(all_cpus))
    _write(cpu_root / "offline", str(offline))
    _write(cpu_root / "isolated", str(isolated))
    for g, (s, d, node, core_id) in enumerate(layout):
        die_key = s * spec.dies + d
        die_cpus = CPUSet(c for h, (ss, dd, *_) in enumerate(layout) if (ss, dd) == (s, d) for c in siblings[h])
        for t in range(threads(g)):
            cid = cpu_id(g, t)
            base = cpu_root / f"cpu{cid}"
            base.mkdir(parents=True, exist_ok=True)
            if cid != 0:  # cpu0 usually cannot go offline and has no `online` file
                _write(base / "online", "0" if cid in offline else "1")
            if cid in offline:
                continue  # the kernel removes topology and cache files of offline CPUs
            topo = base / "topology"
            _write(topo / "physical_package_id", str(s))
            _write(topo / "die_id", str(d))
            _write(topo / "core_id", str(core_id))
            _write(topo / "thread_siblings_list", str(siblings[g] & online))
            _write(topo / "core_cpus_list", str(siblings[g] & online))
            _write(topo / "core_siblings_list", str(package_cpus[s] & online))
            _write(topo / "package_cpus_list", str(package_cpus[s] & online))
            _write(topo / "die_cpus_list", str(die_cpus & online))
            if spec.cpufreq:
                top = "3900000" if g < spec.cores else "2800000"
                freq = base / "cpufreq"
                _write(freq / "base_frequency", "2100000" if g < spec.cores else "1500000")
                _write(freq / "cpuinfo_max_freq", top)
                # What the CPU controller writes (intel_pstate's files), as the kernel lays them out.
                for name, value in (("cpuinfo_min_freq", "800000"), ("scaling_min_freq", "800000"),
                                    ("scaling_max_freq", top), ("scaling_governor", "powersave"),
                                    ("scaling_available_governors", "performance powersave"),
                                    ("energy_performance_preference", "balance_performance")):
                    _write(freq / name, value)
                for i, (name, latency) in enumerate((("POLL", 0), ("C1", 2), ("C1E", 10), ("C6", 170))):
                    state = base / "cpuidle" / f"state{i}"
                    _write(state / "name", name)
                    _write(state / "latency", str(latency))
                    _write(state / "disable", "0")
            if spec.caches:
                l3_cpus, l3_id = l3_domain(g, die_cpus, die_key)
                for idx, (level, kind, shared, cache_id, size) in enumerate((
                        (1, "Data", siblings[g], g, "48K"), (1, "Instruction", siblings[g], g, "32K"),
                        (2, "Unified", l2[g], l2_id[g], "2048K"), (3, "Unified", l3_cpus, l3_id, "107520K"))):
                    c = base / "cache" / f"index{idx}"
                    _write(c / "level", str(level))
                    _write(c / "type", kind)
                    _write(c / "shared_cpu_list", str(shared & online))
                    _write(c / "id", str(cache_id))
                    _write(c / "size", size)
            link = base / f"node{node}"
            if not link.exists():
                os.symlink(os.path.relpath(node_root / f"node{node}", base), link)

    if spec.cpufreq:  # intel_uncore_frequency: one directory per package and die
        for s_id in range(spec.sockets):
            for d_id in range(spec.dies):
                die = cpu_root / "intel_uncore_frequency" / f"package_{s_id:02d}_die_{d_id:02d}"
                for name, value in (("initial_min_freq_khz", "800000"), ("initial_max_freq_khz", "2400000"),
                                    ("min_freq_khz", "800000"), ("max_freq_khz", "2400000")):
                    _write(die / name, value)

    if spec.ecores:  # Intel hybrid parts list each kind's CPUs as a PMU device
        performance = CPUSet(range(spec.cpus)) & online
        _write(root / "sys" / "devices" / "cpu_core" / "cpus", str(performance))
        _write(root / "sys" / "devices" / "cpu_atom" / "cpus", str(online - performance))

    # NUMA nodes: CPU-ful nodes first, then memory-only ones.
    node_socket = {node: s for s, _, node, _ in layout}
    node_die = {node: (s, d) for s, d, node, _ in layout}
    nodes = sorted(node_cpus)
    memory = {n: spec.memory_per_node for n in nodes}
    for i, mo in enumerate(spec.memory_only):
        n = spec.cpu_nodes + i
        nodes.append(n)
        node_socket[n] = mo.socket
        memory[n] = mo.size
    mem_only = set(nodes[spec.cpu_nodes:])

    def distance(a: int, b: int) -> int:
        if a == b:
            return 10
        if a in mem_only or b in mem_only:
            return 17 if node_socket[a] == node_socket[b] else 28
        if node_die[a] == node_die[b]:
            return 11
        if node_socket[a] == node_socket[b]:
            return 12
        return 21

    for n in nodes:
        base = node_root / f"node{n}"
        _write(base / "cpulist", str(node_cpus.get(n, CPUSet()) & online))
        _write(base / "distance", " ".join(str(distance(n, m)) for m in nodes))
        kb = memory[n] >> 10
        _write(base / "meminfo", f"Node {n} MemTotal:       {kb} kB\nNode {n} MemFree:        {kb} kB")
    all_nodes = str(CPUSet(nodes))
    _write(node_root / "online", all_nodes)
    _write(node_root / "possible", all_nodes)
    _write(node_root / "has_cpu", str(CPUSet(n for n in nodes if node_cpus.get(n, CPUSet()) & online)))
    _write(node_root / "has_memory", all_nodes)
    _write(node_root / "has_normal_memory", str(CPUSet(n for n in nodes if n not in mem_only)))
    return root
