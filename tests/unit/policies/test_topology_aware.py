"""The topology-aware policy on generated machines: pool trees, placement, hints, invariants."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from resmgr import policies
from resmgr.model import Container, QOSClass
from resmgr.policies import PolicyError
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.sysfs import discover
from tests.support.machines import tree
from tests.support.world import World, machine

G = QOSClass.GUARANTEED
B = QOSClass.BURSTABLE
BE = QOSClass.BEST_EFFORT
GiB = 1 << 30
TA = "topology-aware"
PMEM = "memory-type.cri-resource-manager.intel.com"

# 2 sockets x 2 NUMA nodes x 4 cores x 2 threads, 16 GiB per node; leaves of 8 CPUs:
# node 0 = 0-3,16-19; node 1 = 4-7,20-23; node 2 = 8-11,24-27; node 3 = 12-15,28-31.
SNC = machine("sockets=2,nodes=2,cores=4,threads=2")
LEAVES = {n: SNC.node_cpus(n) for n in range(4)}


def pools(policy) -> dict[str, dict]:
    return {p["name"]: p for p in policy.describe_pools()}


def pool_of(w: World, c: Container) -> str:
    return w.policy.grants[c.key].pool


# -- pool trees ---------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, count, leaf_cpus", [
    ("sockets=1,cores=10,threads=2", 1, 20),  # a desktop: one pool
    ("sockets=2,nodes=2,cores=14,threads=2,pmem=2x512G", 7, 28),  # SNC server with PMEM
    ("sockets=4,cores=18,threads=2", 5, 36),  # 4 sockets, a node each
    ("sockets=2,dies=2,nodes=2,cores=2,threads=2", 15, 4),  # dies with 2 nodes each
    ("sockets=2,dies=2,cores=4,threads=2", 7, 8),  # a node per die: dies are the leaves
    ("sockets=2,nodes=2,cores=4,threads=1", 7, 4),  # SMT off
    ("sockets=2,cores=16,threads=2,l3=4", 11, 8),  # core complexes: 4 L3 leaves under each socket
])
def test_pool_tree_shapes(spec, count, leaf_cpus):
    policy = policies.create(TA, {"Active": TA}, machine(spec))
    described = policy.describe_pools()
    assert len(described) == count
    parents = {p["parent"] for p in described}
    leaves = [p for p in described if p["name"] not in parents]
    assert {len(CPUSet.parse(p["cpus"])) for p in leaves} == {leaf_cpus}
    root = [p for p in described if not p["parent"]]
    assert len(root) == 1 and CPUSet.parse(root[0]["cpus"]) == policy.topology.online


def test_memory_only_nodes_attach_to_the_nearest_dram_pool():
    topo = machine("sockets=2,nodes=2,cores=14,threads=2,pmem=2x512G")
    described = pools(policies.create(TA, {"Active": TA}, topo))
    assert described["NUMA node #0"]["mems"] == "0,4"  # PMEM node 4 is nearest socket 0's nodes
    assert described["NUMA node #2"]["mems"] == "2,5"
    assert described["socket #1"]["mems"] == "2-3,5"
    assert described["root"]["memory"] == {"dram": 4 * 16 * GiB, "pmem": 2 * 512 * GiB}


def test_offline_cpus_and_available_resources_shape_the_tree():
    topo = machine("sockets=2,nodes=2,cores=4,threads=2,offline=12-15;28-31")
    described = pools(policies.create(TA, {"Active": TA}, topo))
    assert "NUMA node #3" not in described  # no CPUs left: its memory joins the nearest pool
    assert described["socket #1"]["cpus"] == "8-11,24-27"
    assert described["socket #1"]["mems"] == "2-3"
    narrowed = pools(policies.create(TA, {"Active": TA, "AvailableResources": {"cpu": "cpuset:0-7,16-23"}}, SNC))
    assert list(narrowed) == ["socket #0", "NUMA node #0", "NUMA node #1"]


def test_a_machine_without_numa_information_is_one_pool_without_memory_pinning():
    root = tree("sockets=1,cores=4,threads=2")
    shutil.rmtree(root / "sys/devices/system/node")
    for link in (root / "sys/devices/system/cpu").glob("cpu*/node*"):
        link.unlink()
    w = World(TA, discover(str(root)))
    c = w.add(G, 1000, memory=GiB)
    assert len(w.cpus(c)) == 1 and c.resources.cpuset_mems == ""


# -- placement -----------------------------------------------------------------------------------


def test_guaranteed_containers_spread_over_disjoint_numa_nodes():
    w = World(TA, SNC)
    placed = [w.add(G, 2000, memory=GiB) for _ in range(4)]
    assert sorted(pool_of(w, c) for c in placed) == [f"NUMA node #{n}" for n in range(4)]
    for c in placed:
        node = int(pool_of(w, c).rsplit("#", 1)[1])
        assert w.cpus(c) <= LEAVES[node] and w.mems(c) == CPUSet((node,))


def test_big_requests_go_up_the_tree():
    w = World(TA, SNC)
    socket = w.add(G, 12000)
    assert pool_of(w, socket).startswith("socket #") and len(w.cpus(socket)) == 12
    assert w.mems(socket) == CPUSet.parse("0-1") or w.mems(socket) == CPUSet.parse("2-3")
    root = w.add(G, 18000)
    assert pool_of(w, root) == "root" and len(w.cpus(root)) == 18
    assert w.cpus(root).isdisjoint(w.cpus(socket))


def test_a_request_that_fits_nowhere_names_the_container_and_what_was_free():
    w = World(TA, SNC)
    with pytest.raises(PolicyError, match=r"container default/p1/app: no pool can take 40 exclusive CPU\(s\).*"
                                          r"free: root: 32 shared CPUs"):
        w.add(G, 40000)
    assert w.policy.grants == {}


def test_shared_users_follow_their_pool_as_exclusive_grants_come_and_go():
    w = World(TA, SNC)
    shared = w.add(B, 500)
    leaf = pool_of(w, shared)
    assert w.cpus(shared) == LEAVES[int(leaf[-1])]
    # Fill the other three leaves so the next exclusive grant must come from this one.
    others = [w.add(G, 6000) for _ in range(3)]
    assert leaf not in {pool_of(w, c) for c in others}
    taker = w.add(G, 3000)
    assert pool_of(w, taker) == leaf
    assert w.cpus(shared) == LEAVES[int(leaf[-1])] - w.cpus(taker)
    w.remove(taker)
    assert w.cpus(shared) == LEAVES[int(leaf[-1])]


def test_an_adopted_container_keeps_its_exclusive_cpus_when_consistent():
    w = World("topology-aware", machine("sockets=1,nodes=2,cores=4,threads=1"))  # node 0: 0-3, node 1: 4-7
    be = w.add(QOSClass.BEST_EFFORT, 0)
    kept = w.add(QOSClass.GUARANTEED, 2000, running_on="6-7")
    assert w.cpus(kept) == CPUSet.parse("6-7")
    assert w.cpus(be).isdisjoint(w.cpus(kept))
    # Spread over both nodes, or held by another grant: placed afresh instead.
    for running_on in ("3-4", "6-7"):
        other = w.add(QOSClass.GUARANTEED, 2000, running_on=running_on)
        assert len(w.cpus(other)) == 2 and w.cpus(other) != CPUSet.parse(running_on)
        w.remove(other)


def test_adopted_containers_keep_their_cpus_where_another_node_would_rank_first():
    """Found running after the state file was lost: the first adopted is not placed, by the node with
    most room, onto CPUs the second still runs on; each keeps its own, inside one node."""
    w = World("topology-aware", machine("sockets=2,nodes=2,cores=2,threads=2,numbering=linear"),
              ReservedResources={"cpu": "cpuset:0"})  # node n: CPUs 4n..4n+3
    w.add(QOSClass.BURSTABLE, 1500)
    first = w.add(QOSClass.GUARANTEED, 2000, running_on="6-7")
    second = w.add(QOSClass.GUARANTEED, 2000, running_on="12-13")
    assert (w.cpus(first), w.cpus(second)) == (CPUSet.parse("6-7"), CPUSet.parse("12-13"))


def test_exclusive_slices_keep_a_shared_cpu_for_the_pools_shared_users():
    w = World(TA, machine("sockets=1,cores=2,threads=2"))
    shared = w.add(BE, 0)
    w.add(G, 3000)
    with pytest.raises(PolicyError, match="no pool can take 1 exclusive"):
        w.add(G, 1000)
    assert len(w.cpus(shared)) == 1


def test_mixed_and_fractional_requests():
    w = World(TA, SNC)
    mixed = w.add(G, 1500)
    grant = w.policy.grants[mixed.key]
    assert grant.kind == "mixed" and len(grant.exclusive) == 1
    assert w.cpus(mixed) == grant.exclusive | w.policy.cpus_of_grant(grant) and len(w.cpus(mixed)) == 8
    big_fraction = w.add(G, 2500)
    assert w.policy.grants[big_fraction.key].kind == "shared"
    opted = w.add(G, 2500, annotations={"prefer-shared-cpus.cri-resource-manager.intel.com": "false"})
    assert w.policy.grants[opted.key].kind == "mixed" and len(w.policy.grants[opted.key].exclusive) == 2
    forced = w.add(G, 2000, annotations={"cri-resource-manager.intel.com/prefer-shared-cpus": '{"app": true}'})
    assert w.policy.grants[forced.key].kind == "shared"
    burstable = w.add(B, 2000)
    assert w.policy.grants[burstable.key].kind == "shared"


def test_nri_plugins_annotation_domain_is_read_ours_first():
    """nri-plugins users annotate `<hint>.resource-policy.nri.io`: topology-aware reads those too."""
    w = World(TA, SNC)
    nri = w.add(G, 2000, annotations={"prefer-shared-cpus.resource-policy.nri.io/container.app": "true"})
    assert w.policy.grants[nri.key].kind == "shared"
    ours_first = w.add(G, 2000, annotations={"prefer-shared-cpus.resource-policy.nri.io": "true",
                                             "prefer-shared-cpus.cri-resource-manager.intel.com": "false"})
    assert w.policy.grants[ours_first.key].kind == "exclusive"
    with pytest.raises(PolicyError, match="memory-type.resource-policy.nri.io"):
        w.add(G, 1000, annotations={"memory-type.resource-policy.nri.io": "flash"})
    # The domain before it, which nri-plugins' own end-to-end tests still write.
    legacy = w.add(G, 2000, annotations={"prefer-shared-cpus.nri-resmgr.intel.com/pod": "true"})
    assert w.policy.grants[legacy.key].kind == "shared"


def test_prefer_shared_negative_number_places_higher():
    w = World(TA, SNC)
    up = w.add(G, 1000, annotations={"cri-resource-manager.intel.com/prefer-shared-cpus": '{"app": -1}'})
    assert pool_of(w, up).startswith("socket #") and w.policy.grants[up.key].kind == "shared"


def test_isolated_cpus_for_single_cpu_guaranteed_containers():
    topo = machine("sockets=2,nodes=2,cores=4,threads=2,isolated=3;19")
    w = World(TA, topo)
    one = w.add(G, 1000)
    assert w.cpus(one) <= topo.isolated and pool_of(w, one) == "NUMA node #0"
    two = w.add(G, 2000)
    assert w.cpus(two).isdisjoint(topo.isolated)  # several CPUs: sliced unless asked for
    asked = w.add(G, 1000, annotations={"prefer-isolated-cpus.cri-resource-manager.intel.com/pod": "false"})
    assert w.cpus(asked).isdisjoint(topo.isolated)
    shared = w.add(BE, 0)
    assert w.cpus(shared).isdisjoint(topo.isolated)
    w2 = World(TA, topo, **{TA: {"PreferIsolatedCPUs": False}})
    assert w2.cpus(w2.add(G, 1000)).isdisjoint(topo.isolated)


def test_reserved_class():
    w = World(TA, SNC, ReservedResources={"cpu": "cpuset:0,16"})
    system = w.add(B, 100, namespace="kube-system")
    assert w.cpus(system) == CPUSet.parse("0,16") and pool_of(w, system) == "NUMA node #0"
    asked = w.add(B, 100, annotations={"prefer-reserved-cpus.cri-resource-manager.intel.com": "true"})
    assert w.cpus(asked) == CPUSet.parse("0,16")
    ordinary = w.add(B, 100)
    assert w.cpus(ordinary).isdisjoint(CPUSet.parse("0,16"))
    huge = w.add(B, 100, namespace="kube-system", memory=100 * GiB)  # system pods are never refused
    assert w.cpus(huge) == CPUSet.parse("0,16")
    glob = World(TA, SNC, ReservedResources={"cpu": 1}, ReservedPoolNamespaces=["kube-*"])
    assert len(glob.cpus(glob.add(BE, 0, namespace="kube-public"))) == 1
    # kube-system stays on the reserved CPUs when the list leaves it out, as in nri-plugins.
    other = World(TA, SNC, ReservedResources={"cpu": 1}, ReservedPoolNamespaces=["monitoring"])
    system = other.cpus(other.add(B, 100, namespace="kube-system"))
    assert system == other.cpus(other.add(B, 100, namespace="monitoring")) and len(system) == 1


def test_pin_options():
    w = World(TA, SNC, **{TA: {"PinCPU": False, "PinMemory": False}})
    c = w.add(G, 2000, memory=GiB)
    assert c.resources.cpuset_cpus == "" and c.resources.cpuset_mems == ""
    assert len(w.policy.grants[c.key].exclusive) == 2  # still accounted


def test_bad_options_are_rejected():
    with pytest.raises(PolicyError, match="policy.topology-aware.PinCPUs: unknown option"):
        World(TA, SNC, **{TA: {"PinCPUs": True}})
    with pytest.raises(PolicyError, match="PinCPU: expected true or false"):
        World(TA, SNC, **{TA: {"PinCPU": "yes please"}})
    with pytest.raises(PolicyError, match="CPUs 64 are not available"):
        World(TA, SNC, ReservedResources={"cpu": "cpuset:64"})


# -- memory ---------------------------------------------------------------------------------------


def test_memory_that_does_not_fit_a_leaf_goes_up():
    w = World(TA, SNC)
    big = w.add(G, 1000, memory=20 * GiB)
    assert pool_of(w, big).startswith("socket #") and len(w.mems(big)) == 2
    small = [w.add(G, 1000, memory=10 * GiB) for _ in range(3)]
    assert all(pool_of(w, c).startswith("NUMA node") for c in small)
    # Memory is accounted up the tree: with 20 + 10 GiB used in one socket and 10 + 10 GiB in
    # the other, no leaf can take 10 GiB more, but the second socket can.
    assert pool_of(w, w.add(G, 1000, memory=10 * GiB)).startswith("socket #")
    with pytest.raises(PolicyError, match="no pool can take"):
        w.add(G, 1000, memory=30 * GiB)


def test_memory_follows_the_cpus_a_container_really_has():
    """With AvailableResources narrowed to NUMA node 1 (and a reserved CPU on node 0), a container
    placed in the socket's pool runs on node 1's CPUs: its memory is node 1's, as in nri-plugins."""
    n4c16 = machine("sockets=2,nodes=2,cores=2,threads=2,numbering=linear")  # node n: CPUs 4n..4n+3
    w = World(TA, n4c16, AvailableResources={"cpu": "cpuset:1,4-6"}, ReservedResources={"cpu": "cpuset:1"})
    up = w.add(G, 1000, annotations={"prefer-shared-cpus.cri-resource-manager.intel.com": "-1"})
    assert pool_of(w, up) == "socket #0" and w.cpus(up) == CPUSet.parse("4-6")
    assert w.mems(up) == CPUSet.parse("1")


def test_a_reserved_quantity_is_taken_from_the_first_cpus_not_next_to_the_isolated_ones():
    """As cri-resource-manager takes them: packing the reserved CPUs against kernel-isolated ones (on
    socket 1 here) shrank that node's shared pool twice over."""
    topo = machine("sockets=2,nodes=1,cores=4,threads=2,isolated=4-5")
    w = World(TA, topo, ReservedResources={"cpu": 2})
    assert w.policy.reserved == CPUSet.parse("0,8")  # core 0 of socket 0
    assert pools(w.policy)["socket #1"]["shared"] == "6-7,12-15"  # only the isolated CPUs are off it
    assert pools(w.policy)["socket #0"]["shared"] == "1-3,9-11"


def test_cpu_and_memory_preserve_leave_a_containers_cpus_or_memory_as_they_are_while_its_grant_counts():
    """nri-plugins honours cpu.preserve and memory.preserve in topology-aware as in balloons."""
    w = World(TA, SNC)
    kept = w.add(G, 2000, annotations={"cpu.preserve.resource-policy.nri.io": "true"})
    assert w.cpus(kept) == CPUSet() and w.mems(kept)  # its CPUs as kubelet left them; its memory pinned
    assert len(w.policy.grants[kept.key].exclusive) == 2  # still counted: nobody else gets them
    mem = w.add(B, 500, annotations={"memory.preserve.resource-policy.nri.io/container.app": "true"})
    assert w.cpus(mem) and w.mems(mem) == CPUSet()
    other = w.add(G, 4000)  # moves the shared ones: the preserved CPUs are still not written
    assert w.cpus(kept) == CPUSet() and w.cpus(other).isdisjoint(w.policy.grants[kept.key].exclusive)


def test_memory_types():
    topo = machine("sockets=2,nodes=2,cores=4,threads=2,pmem=2x64G,hbm=2x4G")
    kinds = {n.id: n.kind.value for n in topo.nodes.values()}
    assert [kinds[n] for n in (4, 5, 6, 7)] == ["pmem", "pmem", "hbm", "hbm"]
    w = World(TA, topo)
    plain = w.add(G, 1000)
    assert all(kinds[n] in ("dram", "pmem") for n in w.mems(plain))
    pmem = w.add(G, 1000, annotations={PMEM: "pmem"})
    assert [kinds[n] for n in w.mems(pmem)] == ["pmem"]
    hbm = w.add(G, 1000, annotations={f"{PMEM}/container.app": "hbm"})
    assert [kinds[n] for n in w.mems(hbm)] == ["hbm"]  # HBM is usable, only on request
    assert all(kinds[n] != "hbm" for c in (plain, pmem) for n in w.mems(c))
    legacy = w.add(G, 1000, annotations={"cri-resource-manager.intel.com/memory-type": "app: dram,hbm\n"})
    assert {kinds[n] for n in w.mems(legacy)} == {"dram", "hbm"}
    mixed = w.add(G, 1000, annotations={PMEM: "mixed"})
    assert {kinds[n] for n in w.mems(mixed)} == {"dram", "pmem", "hbm"}
    with pytest.raises(PolicyError, match="asks for pmem memory; this machine has dram"):
        World(TA, SNC).add(G, 1000, annotations={PMEM: "pmem"})


def test_memory_of_a_grant_that_may_use_two_types_is_not_charged_in_full_to_both():
    """A DRAM+PMEM grant (the default) of 12 GiB on a node of 16 GiB DRAM and 64 GiB PMEM leaves
    room for a DRAM-only grant of 12 GiB there: the first can live in PMEM. Charged in full to DRAM
    too, the second was refused ("no pool can take ... MiB") while the node had room of one type."""
    w = World(TA, machine("sockets=1,nodes=1,cores=4,threads=2,mem=16G,pmem=1x64G"))
    both = w.add(G, 1000, memory=12 * GiB)
    dram = w.add(G, 1000, memory=12 * GiB, annotations={PMEM: "dram"})
    assert pool_of(w, both) == pool_of(w, dram)
    with pytest.raises(PolicyError, match="no pool can take"):  # DRAM alone is full: 12 + 12 + 8 > 16 + 0
        w.add(G, 1000, memory=8 * GiB, annotations={PMEM: "dram"})
    w.add(G, 1000, memory=40 * GiB)  # the default types still have PMEM room: 12 + 12 + 40 <= 80
    with pytest.raises(PolicyError, match="no pool can take"):
        w.add(G, 1000, memory=20 * GiB)  # 84 > 80


def test_memory_guard_widens_a_grant_that_outgrows_its_pool():
    w = World(TA, SNC)
    c = w.add(G, 1000, memory=8 * GiB)
    leaf = pool_of(w, c)
    assert w.mems(c) == CPUSet((int(leaf[-1]),))
    grown = c.requested.with_cpus("")
    grown.memory_limit_in_bytes = 20 * GiB
    d = w.policy.update(c, grown, w.view())
    assert w.policy.grants[c.key].pool == leaf  # the CPUs stay
    assert w.policy.grants[c.key].memory_pool.startswith("socket #")
    assert len(CPUSet.parse(d.resources.cpuset_mems)) == 2
    assert CPUSet.parse(d.resources.cpuset_cpus) == w.cpus(c)


# -- hints -----------------------------------------------------------------------------------------


def test_affinity_pulls_and_anti_affinity_pushes():
    w = World(TA, SNC)
    pod = w.pod(G, annotations={
        "cri-resource-manager.intel.com/affinity": "b: [a]\n",
        "cri-resource-manager.intel.com/anti-affinity": "c: [a]\n"})
    a = w.add(G, 1000, pod=pod, name="a")
    b = w.add(G, 1000, pod=pod, name="b")
    c = w.add(G, 1000, pod=pod, name="c")
    assert pool_of(w, b) == pool_of(w, a)
    assert pool_of(w, c) != pool_of(w, a)


def test_heavier_affinity_wins():
    w = World(TA, SNC)
    pod = w.pod(G, annotations={"cri-resource-manager.intel.com/affinity": """
z:
  - match: {key: name, operator: Equals, values: [x]}
    weight: 1
  - match: {key: name, operator: In, values: [y]}
    weight: 5
"""})
    x = w.add(G, 1000, pod=pod, name="x")
    y = w.add(G, 1000, pod=pod, name="y")
    assert pool_of(w, x) != pool_of(w, y)
    z = w.add(G, 1000, pod=pod, name="z")
    assert pool_of(w, z) == pool_of(w, y)


def test_affinity_scope_reaches_other_pods():
    w = World(TA, SNC)
    db = w.add(G, 1000, annotations={}, name="db")
    app = w.add(G, 1000, name="app", annotations={"cri-resource-manager.intel.com/affinity": """
app:
  - scope: {key: namespace, operator: Equals, values: [default]}
    match: {key: name, operator: Equals, values: [db]}
"""})
    assert pool_of(w, app) == pool_of(w, db)


def test_colocate_pods_option():
    w = World(TA, SNC, **{TA: {"ColocatePods": True}})
    pod = w.pod(G)
    first = w.add(G, 1000, pod=pod, name="a")
    assert pool_of(w, w.add(G, 1000, pod=pod, name="b")) == pool_of(w, first)
    spread = World(TA, SNC)
    pod = spread.pod(G)
    first = spread.add(G, 1000, pod=pod, name="a")
    assert pool_of(spread, spread.add(G, 1000, pod=pod, name="b")) != pool_of(spread, first)


def test_a_pool_a_shared_request_would_fill_exactly_loses_to_one_that_keeps_room():
    """As cri-resource-manager and nri-plugins rank pools: a pod's second container, drawn to its
    first's NUMA node (ColocatePods), does not take that node's last shared CPU time while another
    pool has room: it goes up to the socket, which still holds its partner's node."""
    w = World(TA, SNC, **{TA: {"ColocatePods": True}})
    pod = w.pod(B)
    first = w.add(B, 7000, pod=pod, name="a")
    node = pool_of(w, first)
    assert w.policy.by_name[node].depth == 2  # a NUMA node of 8 CPUs
    second = w.add(B, 1000, pod=pod, name="b")
    assert pool_of(w, second) == w.policy.by_name[node].parent.name
    third = w.add(B, 500, pod=pod, name="c")  # room left at the node: colocated there
    assert pool_of(w, third) == node


@pytest.mark.parametrize("annotations, message", [
    ({"cri-resource-manager.intel.com/affinity": "app: [unclosed"}, "not valid YAML"),
    ({"cri-resource-manager.intel.com/affinity": "- a\n- b\n"}, "expected a mapping of container name"),
    ({"cri-resource-manager.intel.com/affinity": "app: x\n"}, "container app: expected a list"),
    ({"cri-resource-manager.intel.com/affinity": "app:\n  - match: {key: name, operator: Near}\n"},
     "unknown operator 'Near'"),
    ({"cri-resource-manager.intel.com/affinity": "app:\n  - match: {key: name}\n    weight: heavy\n"},
     "weight must be an integer"),
    ({"cri-resource-manager.intel.com/anti-affinity": "app:\n  - scope: {key: name}\n"}, "match is required"),
    ({"cri-resource-manager.intel.com/affinity": "app:\n  - match: {key: name, operator: Equals}\n"},
     "takes exactly one value"),
    ({PMEM: "dram,flash"}, "unknown memory type 'flash'"),
    ({"prefer-shared-cpus.cri-resource-manager.intel.com": "maybe"}, "'maybe' is not true or false"),
    ({"prefer-shared-cpus.cri-resource-manager.intel.com": "2"}, "must be 0 or negative"),
    ({"prefer-isolated-cpus.cri-resource-manager.intel.com": "perhaps"}, "is not true or false"),
    ({"cri-resource-manager.intel.com/prefer-isolated-cpus": "{app: [1}"}, "not a valid object"),
    ({"prefer-reserved-cpus.cri-resource-manager.intel.com": "sure"}, "is not true or false"),
])
def test_malformed_annotations_are_rejected_with_a_message(annotations, message):
    w = World(TA, SNC, ReservedResources={"cpu": 1})
    with pytest.raises(PolicyError, match=message):
        w.add(G, 1000, annotations=annotations)
    assert w.policy.grants == {} and w.containers == {}


# -- state, reconfiguration, rebalancing ------------------------------------------------------------


def test_state_round_trip_keeps_every_grant():
    w = World(TA, SNC, ReservedResources={"cpu": 1})
    made = [w.add(G, 2000, memory=GiB), w.add(B, 500), w.add(G, 1500), w.add(BE, 0, namespace="kube-system")]
    again = policies.create(TA, {"Active": TA, "ReservedResources": {"cpu": 1}}, SNC)
    again.restore_state(w.policy.export_state())
    assert again.grants == w.policy.grants
    for c in made:
        assert again.cpus_of_grant(again.grants[c.key]) == w.cpus(c)


def test_restore_refuses_grants_the_new_configuration_cannot_hold():
    w = World(TA, SNC)
    g = w.add(G, 2000)
    other = policies.create(TA, {"Active": TA, "AvailableResources": {"cpu": "cpuset:16-31"}}, SNC)
    with pytest.raises(PolicyError, match=f"grant of {g.key}"):
        other.restore_state(w.policy.export_state())
    assert other.grants == {}


def test_reconfigure_keeps_grants_or_changes_nothing():
    w = World(TA, SNC)
    g = w.add(G, 2000)
    shared = w.add(BE, 0)
    mine = w.cpus(g)
    free = sorted(SNC.online - mine)
    d = w.policy.reconfigure({"Active": TA, "ReservedResources": {"cpu": f"cpuset:{free[0]}"}}, w.view())
    w.record(d.updates)
    assert w.cpus(g) == mine and free[0] in w.policy.reserved
    assert free[0] not in w.cpus(shared)
    before = w.policy.export_state()
    with pytest.raises(PolicyError, match="grant of"):
        w.policy.reconfigure({"Active": TA, "ReservedResources": {"cpu": f"cpuset:{min(mine)}"}}, w.view())
    assert w.policy.export_state() == before and free[0] in w.policy.reserved


def test_rebalance_moves_shared_containers_to_a_tighter_fit():
    w = World(TA, SNC)
    blockers = [w.add(G, 7000) for _ in range(4)]  # every leaf down to one shared CPU
    wide = w.add(B, 3000)  # fits no leaf: goes up
    assert not pool_of(w, wide).startswith("NUMA")
    for c in blockers:
        w.remove(c)
    d = w.policy.rebalance(w.view())
    w.record(d.updates)
    assert pool_of(w, wide).startswith("NUMA") and wide.key in d.updates
    assert w.cpus(wide) == LEAVES[int(pool_of(w, wide)[-1])]
    assert w.policy.rebalance(w.view()).updates == {}  # stable once balanced


def test_decisions_are_deterministic():
    def run():
        w = World(TA, machine("sockets=2,nodes=2,cores=4,threads=2,isolated=3"), ReservedResources={"cpu": 1})
        mix = [(G, 2000), (B, 500), (G, 1000), (BE, 0), (G, 1500), (B, 3000)] * 3
        placed = [w.add(q, m, memory=GiB) for q, m in mix]
        w.remove(placed[2])
        w.add(G, 3000)
        return {k: (c.resources.cpuset_cpus, c.resources.cpuset_mems) for k, c in w.containers.items()}

    assert run() == run()


# -- invariants under random churn ------------------------------------------------------------------

CHURN = machine("sockets=2,nodes=2,cores=3,threads=2,isolated=5;17,pmem=2x64G")


class TopologyAwareMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World(TA, CHURN, ReservedResources={"cpu": 1})
        self.initial = self.world.policy.describe_pools()
        self.live: list[Container] = []

    @rule(qos=st.sampled_from(list(QOSClass)), milli=st.sampled_from([0, 100, 500, 1000, 1500, 2000, 3000, 7000]),
          memory=st.sampled_from([0, 1, 8, 20]), system=st.booleans(), pmem=st.booleans())
    def create(self, qos, milli, memory, system, pmem):
        if qos == BE:
            milli = memory = 0
        annotations = {PMEM: "pmem"} if pmem else {}
        try:
            self.live.append(self.world.add(qos, milli, namespace="kube-system" if system else "default",
                                            memory=memory * GiB, annotations=annotations))
        except PolicyError:
            pass

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 100))
    def release(self, index):
        self.world.remove(self.live.pop(index % len(self.live)))

    @precondition(lambda self: self.live)
    @rule()
    def rebalance(self):
        self.world.record(self.world.policy.rebalance(self.world.view()).updates)

    @invariant()
    def exclusive_cpus_belong_to_one_container(self):
        policy = self.world.policy
        seen = CPUSet()
        for c in self.live:
            g = policy.grants[c.key]
            assert seen.isdisjoint(g.exclusive)
            seen |= g.exclusive
        for c in self.live:
            cpus = self.world.cpus(c)
            assert cpus, "an empty cpuset would mean every CPU"
            assert cpus <= CHURN.online
            assert cpus.isdisjoint(seen - policy.grants[c.key].exclusive)

    @invariant()
    def reserved_cpus_only_for_the_reserved_class(self):
        policy = self.world.policy
        for c in self.live:
            g = policy.grants[c.key]
            pool = policy.by_name[g.pool]
            # ... and best-effort containers when exclusive grants hold every shared CPU, as in kubelet
            everything_exclusive = g.on_shared and not g.shared and not any(
                policy.sharable(a) for a in pool.ancestors)
            if self.world.pods[c.pod_id].namespace != "kube-system" and not everything_exclusive:
                assert self.world.cpus(c).isdisjoint(policy.reserved)

    @invariant()
    def mems_belong_to_the_pool(self):
        policy = self.world.policy
        for c in self.live:
            g = policy.grants[c.key]
            mems = self.world.mems(c)
            allowed = policy.by_name[g.memory_pool].all_mems
            pool = policy.by_name[g.pool]
            if g.on_shared and not g.exclusive and not policy.sharable(pool):
                # Exclusive grants took its pool's shared CPUs: it runs on an ancestor's, and its
                # memory goes there too (mems_of_grant).
                allowed |= (policy.accounts.lender(pool) or policy.pools[0]).all_mems
            assert mems and mems <= allowed

    @invariant()
    def shared_users_see_exactly_their_pools_shared_cpus(self):
        policy = self.world.policy
        for c in self.live:
            g = policy.grants[c.key]
            if g.on_shared:
                pool = policy.by_name[g.pool]
                assert self.world.cpus(c) == g.exclusive | policy.shared_cpus(pool)
                if not policy.sharable(pool):  # only a container asking for no CPU time runs elsewhere
                    assert g.shared == 0 and not g.exclusive

    @invariant()
    def shared_capacity_is_never_overcommitted(self):
        # The machine's never; a pool's only after exclusive CPUs were taken by the machine's capacity
        # (the scheduler admitted the pod), and then a notice names it.
        policy = self.world.policy
        assert policy.accounts.shared_free(policy.pools[0]) >= 0
        notices = " ".join(policy.fallback())
        for pool in policy.pools:
            own = 1000 * len(policy.sharable(pool)) - policy.accounts.milli[pool.id]
            assert own >= 0 or not policy.sharable(pool) or f"pool {pool.name}:" in notices

    def teardown(self):
        for c in list(self.live):
            self.world.remove(c)
        assert self.world.policy.grants == {}
        assert self.world.policy.describe_pools() == self.initial


TestTopologyAware = TopologyAwareMachine.TestCase
TestTopologyAware.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)


def test_device_hints_pull_towards_their_numa_node():
    w = World(TA, SNC)
    pod = w.pod(G)
    c = w.add(G, 1000, pod=pod, name="warmup")  # takes node 0 otherwise first in line
    assert pool_of(w, c) == "NUMA node #0"
    from resmgr.model import ContainerState, Resources
    from resmgr.requests import milli_to_shares

    res = Resources(cpu_shares=milli_to_shares(2000), cpu_quota=200000, cpu_period=100000)
    gpu = Container(id="gpu", pod_id=pod.id, name="gpu", state=ContainerState.RUNNING, requested=res,
                    resources=res, hints={"/dev/nvidia0": [3]})
    w.containers[gpu.key] = gpu
    d = w.policy.allocate(gpu, pod, w.view())
    assert w.policy.grants[gpu.key].pool == "NUMA node #3"
    assert CPUSet.parse(d.resources.cpuset_cpus) <= LEAVES[3] and d.resources.cpuset_mems == "3"


def test_device_numa_nodes_from_sysfs(tmp_path):
    import os

    from resmgr.topology.hints import hints

    st = os.stat("/dev/null")
    pci = tmp_path / "sys/devices/pci0000:00/0000:00:05.0"
    (pci / "misc/thing").mkdir(parents=True)
    (pci / "numa_node").write_text("1\n")
    (tmp_path / "sys/dev/char").mkdir(parents=True)
    (tmp_path / f"sys/dev/char/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}").symlink_to(pci / "misc/thing")
    assert hints(["/dev/null", "/dev/does-not-exist", "/etc/hostname"], str(tmp_path)) == {"/dev/null": [1]}
    (pci / "numa_node").write_text("-1\n")  # the kernel does not know
    assert hints(["/dev/null"], str(tmp_path)) == {}


def test_a_rebalance_that_cannot_place_everyone_keeps_the_old_arrangement():
    """Found by the state machine: a container that no longer fitted anywhere went back to its old
    pool after others had already taken that room, overcommitting the pool's shared CPUs."""
    m = TopologyAwareMachine()
    g, b = QOSClass.GUARANTEED, QOSClass.BURSTABLE
    for step in [
            (g, 0, 0, False, False), (g, 0, 8, True, False), (g, 0, 8, True, False), (g, 0, 8, True, False),
            (g, 1000, 8, False, False), (g, 1000, 8, False, False), (b, 1000, 8, False, False),
            (g, 2000, 8, False, False), (g, 1500, 8, False, False), "rebalance",
            (g, 0, 1, True, False), (g, 0, 8, True, False), (g, 0, 20, True, False), (g, 100, 20, False, True),
            (g, 7000, 0, False, False), (g, 0, 20, True, False), "rebalance"]:
        if step == "rebalance":
            m.rebalance()
        else:
            qos, milli, memory, system, pmem = step
            m.create(qos=qos, milli=milli, memory=memory, system=system, pmem=pmem)
        m.shared_capacity_is_never_overcommitted()
        m.shared_users_see_exactly_their_pools_shared_cpus()
        m.exclusive_cpus_belong_to_one_container()
    m.teardown()


# -- best-effort containers once exclusive grants hold every shared CPU ------------------------------

ONE_NODE = machine("sockets=1,nodes=1,cores=8,threads=1")


@pytest.mark.parametrize("best_effort_first", [False, True])
def test_best_effort_runs_on_reserved_cpus_while_every_shared_cpu_is_exclusive(best_effort_first):
    """What the scheduler admits (7 CPUs allocatable) all runs; kubelet's shared pool keeps the reserved CPUs."""
    w = World(TA, ONE_NODE, ReservedResources={"cpu": "cpuset:0"})
    early = w.add(BE, 0) if best_effort_first else None
    guaranteed = [w.add(G, 1000) for _ in range(7)]
    late = w.add(BE, 0)
    assert exclusive(w, guaranteed) == CPUSet.parse("1-7")
    for c in filter(None, (early, late)):
        assert w.cpus(c) == CPUSet([0])
        assert w.policy.describe_grant(c.key)["fallback"] == "reserved"
    assert pools(w.policy)["socket #0"]["shared_elsewhere"] == (2 if early else 1)
    assert w.policy.fallback() == ["exclusive grants hold every shared CPU of pool socket #0: its shared "
                                   "containers run on the reserved CPUs 0"]
    with pytest.raises(PolicyError, match="no pool can take"):  # 300m more than the 7 CPUs allocatable
        w.add(B, 300)
    w.remove(guaranteed[3])  # a CPU comes free: the shared containers move onto it
    freed = CPUSet.parse("1-7") - exclusive(w, [g for g in guaranteed if g.key in w.containers])
    assert w.cpus(late) == freed and "fallback" not in w.policy.describe_grant(late.key)
    assert w.policy.fallback() == []


def exclusive(w: World, containers: list[Container]) -> CPUSet:
    out = CPUSet()
    for c in containers:
        out |= w.cpus(c)
    return out


def test_best_effort_falls_back_to_the_parent_pools_shared_cpus_first():
    w = World(TA, machine("sockets=2,nodes=1,cores=2,threads=1"), ReservedResources={"cpu": "cpuset:0"})
    be = w.add(BE, 0)
    home = w.policy.by_name[pool_of(w, be)]
    root = w.policy.pools[0]
    g = w.add(G, 1000 * len(w.policy.sharable(home)))  # takes all of the home pool's shared CPUs
    assert pool_of(w, g) == home.name and not w.policy.sharable(home)
    assert w.policy.sharable(root), "the other socket still has shared CPUs"
    assert w.cpus(be) == w.policy.sharable(root) and w.policy.describe_grant(be.key)["fallback"] == "parent"
    other = w.add(BE, 0)  # a new one goes where shared CPUs are
    assert "fallback" not in w.policy.describe_grant(other.key) and w.cpus(other) == w.policy.sharable(root)


def test_best_effort_on_the_parent_pools_shared_cpus_takes_their_memory_nodes():
    """Memory follows the CPUs a container runs on, also while its pool's exclusive grants send it
    to another NUMA node's shared CPUs (docs/policies.md), and comes back with it."""
    w = World(TA, machine("sockets=2,nodes=1,cores=2,threads=1"), ReservedResources={"cpu": "cpuset:0"})
    be = w.add(BE, 0)
    home = w.policy.by_name[pool_of(w, be)]
    at_home = w.mems(be)
    g = w.add(G, 1000 * len(w.policy.sharable(home)))
    assert w.policy.describe_grant(be.key)["fallback"] == "parent"
    nodes = CPUSet(n.id for n in w.policy.topology.nodes.values() if n.cpus & w.cpus(be))
    assert w.mems(be) == nodes != at_home
    w.remove(g)
    assert w.mems(be) == at_home


def test_best_effort_on_the_reserved_cpus_takes_their_memory_nodes():
    w = World(TA, machine("sockets=2,nodes=1,cores=2,threads=1"), ReservedResources={"cpu": "cpuset:0"})
    be = w.add(BE, 0)
    at_home = w.mems(be)
    for _ in range(3):  # every shared CPU
        w.add(G, 1000)
    assert w.policy.describe_grant(be.key)["fallback"] == "reserved" and w.cpus(be) == CPUSet([0])
    assert w.mems(be) == CPUSet([0]) != at_home


def test_without_reserved_cpus_a_pool_with_shared_users_keeps_one():
    w = World(TA, ONE_NODE)
    w.add(BE, 0)
    for _ in range(7):
        w.add(G, 1000)
    with pytest.raises(PolicyError):
        w.add(G, 1000)


def test_l3_leaves_share_their_nodes_memory_and_keep_a_container_in_one_l3():
    topo = machine("sockets=1,nodes=2,cores=8,threads=2,l3=4,mem=4G")
    w = World(TA, topo)
    names = [p["name"] for p in w.policy.describe_pools()]
    assert names[:3] == ["socket #0", "NUMA node #0", "NUMA node #1"] and len(names) == 7
    g = w.add(G, 4000, memory=1 << 30)
    l3 = topo.l3_of[min(w.cpus(g))]
    assert w.cpus(g) <= l3 and pool_of(w, g).startswith("L3 cache #")
    assert len(w.mems(g)) == 1
    # Each L3 leaf may use its node's memory, but together they cannot take more than the node has.
    for _ in range(3):
        w.add(BE, 0, memory=1 << 30)
    with pytest.raises(PolicyError):
        w.add(B, 100, memory=5 << 30)


def test_guaranteed_containers_get_performance_cores_on_a_hybrid_desktop():
    topo = machine("cores=8,threads=2,ecores=8,ecluster=4,numbering=linear")
    w = World(TA, topo)
    g = w.add(G, 4000)
    assert w.cpus(g) == CPUSet.parse("0-3")  # two whole P-cores
    e = w.add(G, 4000, annotations={"prefer-core-type.cri-resource-manager.intel.com": "efficient"})
    assert w.cpus(e) in (CPUSet.parse("16-19"), CPUSet.parse("20-23"))  # one L2 cluster
    hidden = w.add(G, 2000, annotations={"hide-hyperthreads.cri-resource-manager.intel.com/pod": "true"})
    assert len(w.cpus(hidden)) == 1 and len(w.policy.grants[hidden.key].exclusive) == 2
    with pytest.raises(PolicyError, match="not performance or efficient"):
        w.add(G, 1000, annotations={"prefer-core-type.cri-resource-manager.intel.com": "fast"})


def test_exclusive_cpus_the_node_has_room_for_are_given_when_shared_capacity_is_spread_thin():
    # Each node's 1500m shared container holds both of its CPUs' capacity; 1000m is free, but split
    # 500m + 500m. The scheduler admits a Guaranteed 1-CPU pod; it used to be refused.
    topo = machine("sockets=1,nodes=2,cores=2,threads=1")
    w = World(TA, topo)
    a, b = w.add(B, 1500), w.add(B, 1500)
    assert pool_of(w, a) != pool_of(w, b)
    g = w.add(G, 1000)
    assert len(w.cpus(g)) == 1 and w.cpus(g).isdisjoint(w.cpus(a) | w.cpus(b))
    assert [n for n in w.policy.fallback() if "request 1500m on 1 shared CPUs" in n]
    with pytest.raises(PolicyError, match="no pool can take"):  # beyond the machine's capacity: refused
        w.add(G, 1000)
    w.remove(g)
    assert w.policy.fallback() == [] and len(w.cpus(a)) == 2


def test_exclusive_cpus_stay_in_one_node_rather_than_split_for_spread_thin_capacity():
    # Each node has 1 CPU of shared capacity to spare; 2 exclusive CPUs fit the socket by its accounting,
    # which used to slice them 1 + 1 over both nodes. They come from one node now.
    topo = machine("sockets=1,nodes=2,cores=4,threads=1")
    w = World(TA, topo)
    a, b = w.add(B, 2500), w.add(B, 2500)
    assert pool_of(w, a) != pool_of(w, b)
    g = w.add(G, 2000)
    assert len({topo.cpus[c].node for c in w.cpus(g)}) == 1 and pool_of(w, g).startswith("NUMA node #")
    assert [n for n in w.policy.fallback() if "request 2500m on 2 shared CPUs" in n]


# nri-plugins' n4c16 machine: 2 sockets x 2 NUMA nodes of 4 CPUs (node n: 4n..4n+3, linear numbering).
N4C16 = machine("sockets=2,nodes=2,cores=2,threads=2,numbering=linear")


def test_a_burstable_container_goes_to_the_deepest_pool_with_free_capacity_for_its_limit():
    # nri-plugins' test14: 2 CPUs requested, 5 allowed: no 4-CPU node holds that, a socket does.
    w = World(TA, N4C16, ReservedResources={"cpu": "cpuset:0"})
    first, second = (w.add(B, 2000, limit=5000) for _ in range(2))
    assert (pool_of(w, first), pool_of(w, second)) == ("socket #1", "socket #0")
    assert w.mems(first) == CPUSet.parse("2-3") and w.mems(second) == CPUSet.parse("0-1")
    # Within a node's capacity it stays in a node.
    assert pool_of(w, w.add(B, 1000, limit=3000)).startswith("NUMA node #")


def test_a_burstable_container_without_a_limit_goes_no_deeper_than_unlimited_burstable():
    w = World(TA, N4C16)
    assert pool_of(w, w.add(B, 2000, limit=0)).startswith("socket #")  # the default: package
    numa = World(TA, N4C16, **{"topology-aware": {"unlimitedBurstable": "numa"}})
    assert pool_of(numa, numa.add(B, 2000, limit=0)).startswith("NUMA node #")
    hinted = w.add(B, 2000, limit=0, annotations={"unlimited-burstable.resource-policy.nri.io": "system"})
    assert pool_of(w, hinted) == "root"
    # A level the machine lacks means the next wider one: no dies here, so a socket.
    die = w.add(B, 500, limit=0, annotations={"unlimited-burstable.resource-policy.nri.io/pod": "die"})
    assert pool_of(w, die).startswith("socket #")
    with pytest.raises(PolicyError, match="'rack' is not one of system, package, die, numa"):
        w.add(B, 500, limit=0, annotations={"unlimited-burstable.resource-policy.nri.io": "rack"})
    with pytest.raises(PolicyError, match="UnlimitedBurstable"):
        World(TA, N4C16, **{"topology-aware": {"UnlimitedBurstable": "rack"}})


def test_shared_containers_go_where_fewest_containers_are_before_most_capacity():
    w = World(TA, N4C16)
    big = w.add(B, 1000)  # node 0
    small = [w.add(B, 100) for _ in range(6)]  # nodes 1-3, then again 1-3: each has one container
    assert pool_of(w, big) == "NUMA node #0"
    assert [pool_of(w, c)[-1] for c in small] == list("123123")
    # Node 0 has the least capacity left but the fewest containers: nri-plugins puts the next one there.
    assert pool_of(w, w.add(B, 100)) == "NUMA node #0"


def test_exclusive_cpus_go_where_most_shared_capacity_is_left_and_idle_containers_count_1m():
    w = World(TA, N4C16)
    idle = w.add(BE, 0)  # node 0
    taker = w.add(G, 2000)
    assert pool_of(w, idle) == "NUMA node #0" and pool_of(w, taker) == "NUMA node #1"


def test_shorthand_affinity_draws_both_ways():
    w = World(TA, N4C16)
    pod = w.pod(B, annotations={"cri-resource-manager.intel.com/affinity": "b: [a]"})
    b = w.add(B, 500, pod=pod, name="b")
    a = w.add(B, 500, pod=pod, name="a")  # placed after b, drawn to it though only b names a
    assert pool_of(w, a) == pool_of(w, b)
    lone = w.pod(B, annotations={"cri-resource-manager.intel.com/anti-affinity": "d: [c]"})
    d = w.add(B, 500, pod=lone, name="d")
    c = w.add(B, 500, pod=lone, name="c")
    assert w.policy.by_name[pool_of(w, c)].cpus.isdisjoint(w.policy.by_name[pool_of(w, d)].cpus)


def test_a_reserved_request_the_reserved_cpus_cannot_hold_runs_on_the_shared_cpus():
    """nri-plugins' rule: kube-system asking for more than the reserved CPUs have left goes to the
    machine's shared CPUs instead of overcommitting the reserved ones."""
    w = World(TA, N4C16, ReservedResources={"cpu": "cpuset:7,11"})
    small = [w.add(G, 200, namespace="kube-system") for _ in range(4)]
    assert all(w.cpus(c) == CPUSet.parse("7,11") for c in small)
    big = w.add(G, 2000, namespace="kube-system")
    assert pool_of(w, big) == "root" and w.cpus(big) == CPUSet(range(16)) - CPUSet.parse("7,11")
    w.remove(big)
    assert pool_of(w, w.add(G, 1000, namespace="kube-system")) == pool_of(w, small[0])  # 1800m of 2000m: fits


@pytest.mark.parametrize("one_leaf", [True, False])
def test_exclusive_cpus_next_to_busy_pools_stay_in_one_leaf_unless_told(one_leaf):
    """A best-effort container in every NUMA node: 4 exclusive CPUs come from one node (its
    best-effort container moves to the socket's shared CPUs), or with ExclusiveInOneLeaf false
    from a socket's two nodes, each keeping a shared CPU, as nri-plugins does."""
    w = World(TA, N4C16, ReservedResources={"cpu": "750m"}, **{"topology-aware": {"ExclusiveInOneLeaf": one_leaf}})
    idle = [w.add(BE, 0) for _ in range(4)]
    big = w.add(G, 4000)
    nodes = {w.policy.topology.cpus[c].node for c in w.cpus(big)}
    assert len(w.cpus(big)) == 4 and len(nodes) == (1 if one_leaf else 2)
    assert all(w.cpus(c) and w.cpus(c).isdisjoint(w.cpus(big)) for c in idle)


def test_a_cold_start_puts_memory_on_pmem_first_and_dram_after():
    """nri-plugins' cold start: a container that may use DRAM and PMEM gets the PMEM node only until
    its duration is over (the engine then asks the policy to warm it)."""
    topo = machine("sockets=1,nodes=1,cores=4,threads=2,pmem=1x64G")
    kinds = {n.id: n.kind.value for n in topo.nodes.values()}
    w = World(TA, topo)
    c = w.add(G, 1000, annotations={f"{PMEM}/container.app": "dram,pmem",
                                    "cold-start.resource-policy.nri.io/container.app": "{ duration: 3s }"})
    assert [kinds[n] for n in w.mems(c)] == ["pmem"] and w.policy.cold() == [c.key]
    decision = w.policy.warm(c.key, w.view())
    assert {kinds[n] for n in CPUSet.parse(decision.updates[c.key].cpuset_mems)} == {"dram", "pmem"}
    assert w.policy.cold() == [] and w.policy.warm(c.key, w.view()).updates == {}
    dram = w.add(G, 1000, annotations={"cold-start.resource-policy.nri.io": "duration: 1m",
                                       f"{PMEM}/container.app": "dram"})
    assert [kinds[n] for n in w.mems(dram)] == ["dram"] and w.policy.cold() == []  # nothing on PMEM to start
    with pytest.raises(PolicyError, match="not a duration"):
        w.add(G, 1000, annotations={"cold-start.resource-policy.nri.io": "duration: soon"})
