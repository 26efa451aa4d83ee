"""Discover the topology from a sysfs tree (`<root>/sys/...`).

Real machines differ in which files exist: cpu0 often has no `online` file, `die_id`
may be missing, numbering may be sparse, SMT may be off, nodes may have memory and
no CPUs, cpufreq and cache may be absent. Every file is optional except the list of
CPUs itself; when something truly required is missing the error names the file.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

from resmgr.topology import interrupts
from resmgr.topology.cpuset import CPUSet, CPUSetError
from resmgr.topology.model import CPU, Cache, CoreKind, MemoryType, Node, Topology

log = logging.getLogger("cri-resmgr.topology")

_CPU_DIR = re.compile(r"cpu(\d+)$")
_NODE_DIR = re.compile(r"node(\d+)$")
_MEMTOTAL = re.compile(r"MemTotal:\s+(\d+)\s*kB")


class TopologyError(Exception):
    pass


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        log.warning("cannot read %s: %s", path, err)
        return None


def _read_int(path: Path, default: int) -> int:
    text = _read(path)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        log.warning("%s: expected a number, got %r", path, text)
        return default


def _read_set(path: Path) -> CPUSet | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return CPUSet.parse(text)
    except CPUSetError as err:
        raise TopologyError(f"{path}: {err}") from None


def _size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip())
    if not m:
        return 0
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def _cpu_dirs(cpudir: Path) -> dict[int, Path]:
    return {int(m.group(1)): p for p in cpudir.iterdir() if (m := _CPU_DIR.match(p.name))}


def _online(cpudir: Path, cpu_dirs: dict[int, Path]) -> CPUSet:
    online = _read_set(cpudir / "online")
    if online is None:
        # No global list: a CPU is online unless its own `online` file says 0 (cpu0 has none).
        online = CPUSet(i for i, p in cpu_dirs.items() if _read_int(p / "online", 1) == 1)
    return online


def online_cpus(host_root: str | Path = "/") -> CPUSet:
    """The CPUs online now, read as discover reads them (OSError or TopologyError if they cannot be)."""
    cpudir = Path(host_root) / "sys" / "devices" / "system" / "cpu"
    return _online(cpudir, _cpu_dirs(cpudir))


def discover(host_root: str | Path = "/") -> Topology:
    """Read the topology below host_root (which holds `sys/`)."""
    sysdir = Path(host_root) / "sys" / "devices" / "system"
    cpudir = sysdir / "cpu"
    if not cpudir.is_dir():
        raise TopologyError(f"{cpudir} does not exist: not a sysfs tree (check --host-root)")
    cpu_dirs = _cpu_dirs(cpudir)
    if not cpu_dirs:
        raise TopologyError(f"{cpudir} lists no cpuN directories")
    online = _online(cpudir, cpu_dirs)
    isolated = _read_set(cpudir / "isolated") or CPUSet()
    nodes_dir = sysdir / "node"
    node_cpus: dict[int, CPUSet] = {}
    node_dirs: dict[int, Path] = {}
    if nodes_dir.is_dir():
        for p in nodes_dir.iterdir():
            if m := _NODE_DIR.match(p.name):
                node_dirs[int(m.group(1))] = p
                node_cpus[int(m.group(1))] = _read_set(p / "cpulist") or CPUSet()
    cpu_node = {cpu: n for n, cpus in node_cpus.items() for cpu in cpus}

    cpus: dict[int, CPU] = {}
    for i in sorted(cpu_dirs):
        if i not in online:
            continue
        p = cpu_dirs[i]
        topo = p / "topology"
        if not topo.is_dir():
            log.warning("%s missing for online CPU %d; assuming its own core on package 0", topo, i)
        package = max(_read_int(topo / "physical_package_id", 0), 0)  # -1 on some platforms
        die = max(_read_int(topo / "die_id", 0), 0)
        core = _read_int(topo / "core_id", i)
        threads = _read_set(topo / "thread_siblings_list") or _read_set(topo / "core_cpus_list") \
            or CPUSet([i])
        node = cpu_node.get(i, -1)
        if node < 0:
            link = next((int(m.group(1)) for q in p.glob("node*") if (m := _NODE_DIR.match(q.name))), -1)
            node = link
        freq = p / "cpufreq"
        cpus[i] = CPU(id=i, package=package, die=die, core=core, node=node, threads=threads & online,
                      isolated=i in isolated, base_frequency=_read_int(freq / "base_frequency", 0),
                      max_frequency=_read_int(freq / "cpuinfo_max_freq", 0))
    if not cpus:
        raise TopologyError(f"{cpudir}: no online CPUs found")
    kinds = _core_kinds(Path(host_root) / "sys" / "devices", cpu_dirs, online)
    if kinds:
        cpus = {i: dataclasses.replace(c, kind=kinds.get(i, CoreKind.UNKNOWN)) for i, c in cpus.items()}
    offline = CPUSet(cpu_dirs) - online

    nodes = _nodes(node_dirs, node_cpus, online)
    if not nodes:  # a kernel without NUMA: one node holding everything
        nodes = {0: Node(0, CPUSet(cpus), _meminfo(Path(host_root) / "proc" / "meminfo"),
                         MemoryType.DRAM, {0: 10})}
        cpus = {i: dataclasses.replace(c, node=0) for i, c in cpus.items()}
    return Topology(cpus=cpus, offline=offline, isolated=isolated & online, nodes=nodes,
                    caches=_caches(cpu_dirs, online), interrupts=_interrupts(host_root))


def _core_kinds(devices: Path, cpu_dirs: dict[int, Path], online: CPUSet) -> dict[int, CoreKind]:
    """CPU -> core kind on a hybrid part, {} elsewhere. Intel hybrid parts list their P- and E-cores
    as two PMU devices (cpu_core, cpu_atom); other asymmetric parts (Arm big.LITTLE, some AMD) give
    each CPU a cpu_capacity, where the largest is the performance kind."""
    core, atom = _read_set(devices / "cpu_core" / "cpus"), _read_set(devices / "cpu_atom" / "cpus")
    if core and atom:
        return {**{i: CoreKind.PERFORMANCE for i in core & online}, **{i: CoreKind.EFFICIENT for i in atom & online}}
    capacity = {i: _read_int(p / "cpu_capacity", 0) for i, p in cpu_dirs.items() if i in online}
    if len(set(capacity.values())) > 1 and 0 not in capacity.values():
        top = max(capacity.values())
        return {i: CoreKind.PERFORMANCE if c == top else CoreKind.EFFICIENT for i, c in capacity.items()}
    return {}


def _meminfo(path: Path) -> int:
    text = _read(path) or ""
    m = _MEMTOTAL.search(text)
    return int(m.group(1)) * 1024 if m else 0


def _nodes(node_dirs: dict[int, Path], node_cpus: dict[int, CPUSet], online: CPUSet) -> dict[int, Node]:
    ids = sorted(node_dirs)
    memory = {n: _meminfo(node_dirs[n] / "meminfo") for n in ids}
    distances: dict[int, dict[int, int]] = {}
    for n in ids:
        text = _read(node_dirs[n] / "distance")
        values = [int(v) for v in text.split()] if text else []
        # The kernel lists distances to online nodes in ID order.
        if len(values) == len(ids):
            distances[n] = dict(zip(ids, values, strict=True))
        else:
            distances[n] = {m: (10 if m == n else 20) for m in ids}
            if text is not None:
                log.warning("%s has %d entries for %d nodes; assuming 10 local / 20 remote",
                            node_dirs[n] / "distance", len(values), len(ids))
    dram = [memory[n] for n in ids if node_cpus[n] & online and memory[n]]
    average = sum(dram) / len(dram) if dram else 0
    nodes = {}
    for n in ids:
        cpus = node_cpus[n] & online
        if cpus or not memory[n]:
            kind = MemoryType.DRAM
        else:
            kind = MemoryType.PMEM if memory[n] >= average else MemoryType.HBM
        nodes[n] = Node(n, cpus, memory[n], kind, distances[n])
    return nodes


def _interrupts(host_root: str | Path) -> dict[int, str]:
    """/proc/interrupts below host_root ({} where there is none)."""
    try:
        return interrupts.parse((Path(host_root) / "proc" / "interrupts").read_text())
    except OSError:
        return {}


def _caches(cpu_dirs: dict[int, Path], online: CPUSet) -> tuple[Cache, ...]:
    seen: dict[tuple[int, str, int | str], Cache] = {}
    for i in sorted(cpu_dirs):
        if i not in online:
            continue
        cache_dir = cpu_dirs[i] / "cache"
        if not cache_dir.is_dir():
            continue
        for idx in sorted(cache_dir.glob("index*")):
            level = _read_int(idx / "level", 0)
            kind = _read(idx / "type") or "Unified"
            shared = _read_set(idx / "shared_cpu_list") or CPUSet([i])
            cache_id = _read_int(idx / "id", -1)
            key = (level, kind, cache_id if cache_id >= 0 else str(shared))
            if key not in seen:
                seen[key] = Cache(level, kind, cache_id, shared & online, _size(_read(idx / "size") or ""))
    return tuple(sorted(seen.values(), key=lambda c: (c.level, c.kind, c.id, c.cpus.bits)))
