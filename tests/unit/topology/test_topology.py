"""Topology discovery from generated sysfs trees shaped like real machines."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resmgr.topology.cpuset import CPUSet, CPUSetError
from resmgr.topology.generate import GiB, MachineSpec, MemoryOnlyNode, generate, parse_spec
from resmgr.topology.model import CoreKind, MemoryType
from resmgr.topology.sysfs import TopologyError, discover, online_cpus

# -- CPUSet ---------------------------------------------------------------------------


@pytest.mark.parametrize("text,ids,canonical", [
    ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11"),
    ("", [], ""),
    ("5", [5], "5"),
    (" 3,1-2 ", [1, 2, 3], "1-3"),
    ("0,2,4", [0, 2, 4], "0,2,4"),
    ("200-223", list(range(200, 224)), "200-223"),
])
def test_cpuset_parse_and_format(text, ids, canonical):
    s = CPUSet.parse(text)
    assert s.sorted() == ids and str(s) == canonical and len(s) == len(ids)


@pytest.mark.parametrize("bad", ["a", "3-1", "1-", "-2", "1,,x", "0x3"])
def test_cpuset_rejects_bad_lists(bad):
    with pytest.raises(CPUSetError):
        CPUSet.parse(bad)


@given(st.sets(st.integers(0, 300)), st.sets(st.integers(0, 300)))
def test_cpuset_behaves_like_a_set(a, b):
    x, y = CPUSet(a), CPUSet(b)
    assert (x | y).sorted() == sorted(a | b)
    assert (x & y).sorted() == sorted(a & b)
    assert (x - y).sorted() == sorted(a - b)
    assert (x <= y) == (a <= b) and x.isdisjoint(y) == a.isdisjoint(b)
    assert CPUSet.parse(str(x)) == x
    assert x.first(3).sorted() == sorted(a)[:3]


# -- discovery --------------------------------------------------------------------------


def machine(tmp_path, spec: MachineSpec):
    return discover(generate(spec, tmp_path))


def test_desktop_one_socket(tmp_path):
    t = machine(tmp_path, MachineSpec(cores_per_node=10, threads=2, numbering="linear"))
    assert len(t.cpus) == 20 and len(t.packages) == 1 and list(t.nodes) == [0]
    assert t.cpus[0].threads == CPUSet([0, 1])
    assert t.nodes[0].kind == MemoryType.DRAM and t.nodes[0].memory == 16 * GiB
    assert {c.level for c in t.caches} == {1, 2, 3}


def test_two_socket_sub_numa_clustering(tmp_path):
    t = machine(tmp_path, parse_spec("sockets=2,nodes=2,cores=14,threads=2,mem=96G"))
    assert len(t.cpus) == 112
    assert t.packages == {0: CPUSet.parse("0-27,56-83"), 1: CPUSet.parse("28-55,84-111")}
    assert t.package_nodes(0) == [0, 1] and t.package_nodes(1) == [2, 3]
    assert t.nodes[0].cpus == CPUSet.parse("0-13,56-69")
    assert t.nodes[0].distances == {0: 10, 1: 11, 2: 21, 3: 21}
    assert t.cpus[56].threads == CPUSet([0, 56]) and t.cpus[56].core == t.cpus[0].core


def test_four_sockets(tmp_path):
    t = machine(tmp_path, parse_spec("sockets=4,cores=18,threads=2"))
    assert len(t.cpus) == 144 and len(t.packages) == 4 and len(t.nodes) == 4
    assert all(len(n.cpus) == 36 for n in t.nodes.values())


def test_memory_only_nodes_are_pmem_or_hbm(tmp_path):
    spec = parse_spec("sockets=2,nodes=2,cores=14,threads=2,mem=96G,pmem=2x512G")
    spec.memory_only.append(MemoryOnlyNode("hbm", 16 * GiB, 0))
    t = machine(tmp_path, spec)
    kinds = {n.id: n.kind for n in t.nodes.values()}
    assert kinds == {0: "dram", 1: "dram", 2: "dram", 3: "dram", 4: "pmem", 5: "pmem", 6: "hbm"}
    assert not t.nodes[4].cpus and t.nodes[4].memory == 512 * GiB
    assert t.nodes[4].distances[0] == 17 and t.nodes[4].distances[2] == 28


def test_smt_off(tmp_path):
    t = machine(tmp_path, MachineSpec(cores_per_node=8, threads=1))
    assert len(t.cpus) == 8 and all(len(c.threads) == 1 for c in t.cpus.values())


def test_isolated_and_offline_cpus(tmp_path):
    t = machine(tmp_path, MachineSpec(cores_per_node=4, threads=2, isolated="2,6", offline="3,7"))
    assert t.isolated == CPUSet([2, 6]) and t.cpus[2].isolated
    assert t.offline == CPUSet([3, 7]) and 3 not in t.cpus
    assert t.cpus[2].threads == CPUSet([2, 6])
    assert t.nodes[0].cpus == CPUSet.parse("0-2,4-6")
    assert t.cpus[3 - 3].threads == CPUSet([0, 4])


def test_missing_optional_files(tmp_path):
    root = generate(MachineSpec(sockets=2, cores_per_node=2, threads=2), tmp_path)
    cpu = root / "sys/devices/system/cpu"
    (cpu / "online").unlink()  # rely on per-CPU online files; cpu0 has none
    (cpu / "isolated").unlink()
    for p in cpu.glob("cpu*/topology/die_id"):
        p.unlink()
    for p in cpu.glob("cpu*/cpufreq"):
        shutil.rmtree(p)
    for p in cpu.glob("cpu*/cache"):
        shutil.rmtree(p)
    t = discover(root)
    assert len(t.cpus) == 8 and len(t.packages) == 2 and t.caches == ()
    assert all(c.die == 0 and c.base_frequency == 0 for c in t.cpus.values())


def test_no_numa_directory_means_one_node(tmp_path):
    root = generate(MachineSpec(cores_per_node=2, threads=2), tmp_path)
    shutil.rmtree(root / "sys/devices/system/node")
    (root / "proc").mkdir()
    (root / "proc/meminfo").write_text("MemTotal:       8000000 kB\n")
    t = discover(root)
    assert list(t.nodes) == [0] and t.nodes[0].memory == 8000000 * 1024
    assert all(c.node == 0 for c in t.cpus.values())


def test_sparse_node_numbering(tmp_path):
    root = generate(parse_spec("sockets=2,cores=2,threads=1"), tmp_path)
    nodes = root / "sys/devices/system/node"
    (nodes / "node1").rename(nodes / "node4")
    t = discover(root)
    assert sorted(t.nodes) == [0, 4]
    assert t.nodes[4].distances == {0: 21, 4: 10}
    assert t.cpus[2].node == 4


def test_not_a_sysfs_tree_names_the_path(tmp_path):
    with pytest.raises(TopologyError, match=str(tmp_path)):
        discover(tmp_path)


def test_bad_cpu_list_names_the_file(tmp_path):
    root = generate(MachineSpec(), tmp_path)
    (root / "sys/devices/system/cpu/online").write_text("0-x\n")
    with pytest.raises(TopologyError, match="cpu/online"):
        discover(root)


def test_this_machine():
    t = discover("/")
    assert t.cpus and t.nodes


def test_a_hybrid_desktop_has_core_kinds_and_l2_clusters(tmp_path):
    """P-cores 0-7 with hyperthreads, E-cores 8-15 in two L2 clusters of four (cpu_core/cpu_atom)."""
    t = machine(tmp_path, parse_spec("cores=4,threads=2,ecores=8,ecluster=4,numbering=linear"))
    assert t.hybrid
    assert t.kinds == {CoreKind.EFFICIENT: CPUSet.parse("8-15"), CoreKind.PERFORMANCE: CPUSet.parse("0-7")}
    assert t.cpus[8].threads == CPUSet([8]) and t.cpus[0].threads == CPUSet([0, 1])
    assert t.cache_groups(2)[-2:] == [CPUSet.parse("8-11"), CPUSet.parse("12-15")]
    assert t.l2_of[9] == CPUSet.parse("8-11") and t.l2_of[1] == CPUSet([0, 1])
    assert t.l3_of[0] == CPUSet.parse("0-15")
    assert "core kinds: efficient 8-15, performance 0-7" in t.describe()
    assert "L2 clusters: 8-11 12-15" in t.describe()


def test_core_kinds_from_cpu_capacity(tmp_path):
    """Parts without the two PMU devices (Arm big.LITTLE): the largest cpu_capacity is performance."""
    root = generate(MachineSpec(cores_per_node=4, threads=1), tmp_path)
    for cpu, capacity in enumerate((1024, 1024, 446, 446)):
        (root / "sys/devices/system/cpu" / f"cpu{cpu}" / "cpu_capacity").write_text(f"{capacity}\n")
    t = discover(root)
    assert t.kinds == {CoreKind.EFFICIENT: CPUSet([2, 3]), CoreKind.PERFORMANCE: CPUSet([0, 1])}


def test_a_machine_of_one_core_kind_is_not_hybrid(tmp_path):
    root = generate(parse_spec("sockets=2,cores=4,threads=2"), tmp_path)
    for cpu in range(16):  # equal capacities say nothing
        (root / "sys/devices/system/cpu" / f"cpu{cpu}" / "cpu_capacity").write_text("1024\n")
    t = discover(root)
    assert not t.hybrid and t.kinds == {CoreKind.UNKNOWN: t.online}
    assert t.l2_of[0] == t.cpus[0].threads and t.l3_of[0] == t.packages[0]


def test_the_online_cpus_read_now_as_discovery_reads_them(tmp_path):
    root = generate(parse_spec("cores=4,threads=1,offline=2"), tmp_path)
    assert online_cpus(root) == discover(root).online == CPUSet.parse("0-1,3")
    (root / "sys/devices/system/cpu/online").unlink()  # no global list: each CPU's own file says
    assert online_cpus(root) == CPUSet.parse("0-1,3")
