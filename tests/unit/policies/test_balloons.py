"""The balloons policy on generated machines: types, sizing, preferences, idle CPUs, state."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from resmgr import policies
from resmgr.model import QOSClass
from resmgr.policies import PolicyError
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.model import CoreKind
from tests.support.world import World, machine

G, B, BE = QOSClass.GUARANTEED, QOSClass.BURSTABLE, QOSClass.BEST_EFFORT
SERVER = machine("sockets=2,cores=4,threads=2")  # socket 0: 0-3,8-11; socket 1: 4-7,12-15
HYBRID = machine("cores=8,threads=2,ecores=8,ecluster=4,numbering=linear")  # P 0-15 (pairs), E 16-23
TYPE = "balloon.balloons.cri-resource-manager.intel.com"


def world(types: list[dict], topology=SERVER, **options) -> World:
    return World("balloons", topology, ReservedResources={"cpu": 1},
                 balloons={"BalloonTypes": types, **options})


def balloon(w: World, c) -> str:
    return w.policy.describe_grant(c.key)["pool"]


def test_containers_join_balloons_that_grow_up_to_max_cpus_and_shrink():
    w = world([{"Name": "quad", "MaxCPUs": 4, "Namespaces": ["*"]}])
    a = w.add(B, 1500)
    assert balloon(w, a) == "quad[0]" and len(w.cpus(a)) == 2
    b = w.add(B, 1500)
    assert balloon(w, b) == "quad[0]" and len(w.cpus(a)) == 3 and w.cpus(a) == w.cpus(b)  # inflated, a updated
    c = w.add(G, 2000)
    assert balloon(w, c) == "quad[1]" and w.cpus(c).isdisjoint(w.cpus(a))  # 5 CPUs would exceed MaxCPUs
    w.remove(b)
    assert len(w.cpus(a)) == 2  # deflated
    w.remove(a)
    assert [p["name"] for p in w.policy.describe_pools()] == ["reserved[0]", "quad[1]", "default[0]"]
    with pytest.raises(PolicyError, match="MaxCPUs 4"):
        w.add(G, 5000)


def test_types_by_annotation_namespace_and_expressions_reserved_and_default():
    w = world([{"Name": "db", "Namespaces": ["db-*"]},
               {"Name": "ml", "MatchExpressions": [{"key": "pod/labels/app", "operator": "In", "values": ["train"]}]},
               {"Name": "pinned", "MinCPUs": 2}])
    assert balloon(w, w.add(B, 100, namespace="db-prod")) == "db[0]"
    pod = w.pod(B)
    pod.labels["app"] = "train"
    assert balloon(w, w.add(B, 100, pod=pod)) == "ml[0]"
    assert balloon(w, w.add(B, 100, annotations={f"{TYPE}/pod": "pinned"})) == "pinned[0]"
    assert balloon(w, w.add(B, 100, annotations={"balloon.balloons.resource-policy.nri.io": "pinned"})) \
        == "pinned[0]"
    system = w.add(B, 100, namespace="kube-system")
    other = w.add(BE, 0)
    assert balloon(w, system) == "reserved[0]" and balloon(w, other) == "default[0]"
    assert w.cpus(system) == w.cpus(other) == w.policy.reserved  # default: the reserved CPUs (cri-resmgr)
    with pytest.raises(PolicyError, match="balloon type 'nope' does not exist"):
        w.add(B, 100, annotations={TYPE: "nope"})


def test_min_balloons_by_priority_and_prefer_new_balloons():
    w = world([{"Name": "low", "MinBalloons": 1, "MinCPUs": 2, "AllocatorPriority": "low"},
               {"Name": "solo", "MinBalloons": 2, "MinCPUs": 2, "PreferNewBalloons": True, "MaxBalloons": 3,
                "Namespaces": ["*"]}])
    pools = {p["name"]: CPUSet.parse(p["cpus"]) for p in w.policy.describe_pools()}
    assert set(pools) == {"reserved[0]", "solo[0]", "solo[1]", "low[0]", "default[0]"}
    assert all(len(pools[n]) == 2 for n in ("solo[0]", "solo[1]", "low[0]"))
    placed = [balloon(w, w.add(G, 1000)) for _ in range(4)]
    assert placed[:3] == ["solo[0]", "solo[1]", "solo[2]"]  # empty ones first, then a new one
    assert placed[3] in ("solo[0]", "solo[1]", "solo[2]")  # MaxBalloons reached: share
    with pytest.raises(PolicyError, match="no room for 3 balloons of 6 CPUs"):
        policies.create("balloons", {"ReservedResources": {"cpu": 1}, "balloons": {"BalloonTypes": [
            {"Name": "huge", "MinBalloons": 3, "MinCPUs": 6}]}}, SERVER)


def test_pods_and_namespaces_spread_or_gather():
    w = world([{"Name": "t", "Namespaces": ["*"], "PreferSpreadingPods": True, "MinBalloons": 2, "MinCPUs": 2}])
    pod = w.pod(B)
    a, b = w.add(B, 500, pod=pod, name="a"), w.add(B, 500, pod=pod, name="b")
    assert balloon(w, a) != balloon(w, b)
    w = world([{"Name": "t", "Namespaces": ["*"], "PreferPerNamespaceBalloon": True, "MinCPUs": 1}])
    x, y, z = w.add(B, 100, namespace="x"), w.add(B, 100, namespace="y"), w.add(B, 100, namespace="x")
    assert balloon(w, x) == balloon(w, z) != balloon(w, y)


def _by_team(w: World, teams: tuple[str, ...]) -> list:
    """A 200m container in a new pod labelled team=<t> for each t."""
    out = []
    for team in teams:
        p = w.pod(B)
        p.labels["team"] = team
        out.append(w.add(B, 200, pod=p))
    return out


def test_group_by_label_keeps_groups_apart():
    w = world([{"Name": "g", "Namespaces": ["*"], "GroupBy": "${pod/labels/team}"}])
    pods = _by_team(w, ("red", "blue", "red"))
    assert balloon(w, pods[0]) == balloon(w, pods[2]) != balloon(w, pods[1])
    # The default type groups too, though it sets no MinCPUs or MaxCPUs: each group its own balloon.
    d = world([{"Name": "default", "GroupBy": "${pod/labels/team}"}])
    grouped = _by_team(d, ("red", "blue", "red"))
    assert balloon(d, grouped[0]) == balloon(d, grouped[2]) != balloon(d, grouped[1])
    assert d.cpus(grouped[0]).isdisjoint(d.cpus(grouped[1]) | d.policy.reserved)


def test_idle_cpus_are_shared_within_the_scope():
    w = world([{"Name": "t", "Namespaces": ["*"], "ShareIdleCPUsInSame": "package"}])
    a = w.add(B, 1000)
    own = CPUSet.parse(w.policy.describe_pools()[1]["cpus"])
    package = next(p for p in SERVER.packages.values() if own <= p)
    assert w.cpus(a) == package - w.policy.reserved  # its CPU and every idle one of its package
    w2 = world([{"Name": "t", "Namespaces": ["*"], "ShareIdleCPUsInSame": "system"},
                {"Name": "solo", "MinCPUs": 4}])
    a = w2.add(B, 1000)
    solo = w2.add(B, 100, annotations={TYPE: "solo"})
    assert w2.cpus(a) & w2.cpus(solo) == CPUSet()  # never on another balloon's CPUs
    assert len(w2.cpus(a)) == 16 - 1 - 4  # everything but reserved and the other balloon


def test_hybrid_core_types_and_hidden_hyperthreads():
    w = world([{"Name": "fast", "PreferCoreType": "performance", "Namespaces": ["fast"]},
               {"Name": "eco", "PreferCoreType": "efficient", "Namespaces": ["eco"]},
               {"Name": "ht", "HideHyperthreads": True, "Namespaces": ["ht"]}], topology=HYBRID)
    fast, eco = w.add(G, 4000, namespace="fast"), w.add(G, 4000, namespace="eco")
    assert w.cpus(fast) <= HYBRID.kinds[CoreKind.PERFORMANCE] and len({HYBRID.core_of[c] for c in w.cpus(fast)}) == 2
    assert w.cpus(eco) <= HYBRID.kinds[CoreKind.EFFICIENT] and len({HYBRID.l2_of[c] for c in w.cpus(eco)}) == 1
    ht = w.add(G, 4000, namespace="ht")
    assert len(w.cpus(ht)) == 2 and len({HYBRID.core_of[c] for c in w.cpus(ht)}) == 2


def test_preserved_containers_are_left_alone():
    w = world([{"Name": "t", "Namespaces": ["*"]}], Preserve={"MatchExpressions": [
        {"key": "name", "operator": "In", "values": ["keep"]}]})
    kept = w.add(B, 1000, name="keep")
    assert w.containers[kept.key].resources.cpuset_cpus == ""
    assert w.policy.describe_grant(kept.key) is None
    cpu_only = w.add(B, 1000, annotations={"cpu.preserve.resource-policy.nri.io": "true"})
    assert w.containers[cpu_only.key].resources.cpuset_cpus == "" and w.mems(cpu_only)


def test_type_classes_unless_annotated():
    w = world([{"Name": "t", "Namespaces": ["*"], "RdtClass": "gold", "BlockioClass": "slow"}])
    c = w.add(B, 100)
    assert w.containers[c.key].classes == {"rdt": "gold", "blockio": "slow"}
    c = w.add(B, 100, annotations={"rdtclass.cri-resource-manager.intel.com": "silver"})
    assert w.containers[c.key].classes["rdt"] == "silver"


def test_nri_plugins_spelling_and_errors():
    w = World("balloons", SERVER, balloons={
        "reservedResources": {"cpu": "cpuset:15"}, "pinMemory": False,
        "balloonTypes": [{"name": "quad", "maxCPUs": 4, "namespaces": ["*"], "allocatorPriority": "normal"}]})
    c = w.add(B, 500)
    assert w.policy.reserved == CPUSet([15]) and w.containers[c.key].resources.cpuset_mems == ""
    for bad, message in (({"BalloonTypes": [{"MinCPUs": 1}]}, "Name is required"),
                         ({"BalloonTypes": [{"Name": "a", "MinCPUs": 4, "MaxCPUs": 2}]}, "more than MaxCPUs"),
                         ({"BalloonTypes": [{"Name": "a", "Bogus": 1}]}, "unknown option"),
                         ({"BalloonTypes": [{"Name": "a", "ShareIdleCPUsInSame": "rack"}]}, "not one of"),
                         ({"BalloonTypes": [{"Name": "a", "Components": [{"balloonType": "b"}]}]},
                          "component 'b', which is not a balloon type"),
                         ({"BalloonTypes": [{"Name": "a", "Components": [{"balloonType": "a"}]}]},
                          "a is a component of itself"),
                         ({"PinCPU": "yes"}, "true or false")):
        with pytest.raises(PolicyError, match=message):
            policies.create("balloons", {"balloons": bad}, SERVER)


def test_state_round_trip_and_a_failed_allocation_changes_nothing():
    w = world([{"Name": "t", "Namespaces": ["*"], "MaxCPUs": 3, "MaxBalloons": 1}])
    a = w.add(B, 2000)
    before = w.policy.export_state()
    with pytest.raises(PolicyError, match="MaxBalloons 1"):
        w.add(B, 2000)
    assert w.policy.export_state() == before
    fresh = policies.create("balloons", {"ReservedResources": {"cpu": 1}, "balloons": {"BalloonTypes": [
        {"Name": "t", "Namespaces": ["*"], "MaxCPUs": 3, "MaxBalloons": 1}]}}, SERVER)
    fresh.restore_state(before)
    assert fresh.export_state() == before and fresh.describe_grant(a.key)["pool"] == "t[0]"
    other = policies.create("balloons", {"ReservedResources": {"cpu": 1}}, SERVER)
    with pytest.raises(PolicyError, match="does not exist now"):
        other.restore_state(before)


class BalloonChurn(RuleBasedStateMachine):
    """Random adds and removes: balloons stay disjoint, sized to their requests, within limits."""

    def __init__(self) -> None:
        super().__init__()
        self.w = world([{"Name": "small", "MaxCPUs": 3, "Namespaces": ["s"], "ShareIdleCPUsInSame": "numa"},
                        {"Name": "big", "MinCPUs": 2, "MinBalloons": 1, "Namespaces": ["b"],
                         "PreferNewBalloons": True}])
        self.live: list = []

    @rule(ns=st.sampled_from(["s", "b", "x"]), milli=st.sampled_from([0, 200, 1000, 1500, 2500]))
    def add(self, ns, milli):
        try:
            self.live.append(self.w.add(B if milli else BE, milli, namespace=ns))
        except PolicyError:
            pass

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def remove(self, i):
        self.w.remove(self.live.pop(i % len(self.live)))

    @invariant()
    def balloons_are_disjoint_and_sized(self):
        p = self.w.policy
        seen = CPUSet()
        for b in p.fleet.balloons:
            assert b.cpus.isdisjoint(seen) and b.cpus.isdisjoint(p.reserved)
            seen |= b.cpus
            if not b.type.on_reserved:
                assert len(b.cpus) >= max(-(-b.milli // 1000), b.type.min_cpus)
                assert not b.type.max_cpus or len(b.cpus) <= b.type.max_cpus
        for c in self.live:
            cpus = self.w.cpus(c)
            b = p.where[c.key]
            assert cpus and (cpus == p.reserved if b.type.on_reserved else b.cpus <= cpus)


TestBalloonChurn = BalloonChurn.TestCase
TestBalloonChurn.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)


def test_load_classes_keep_loaded_balloons_off_each_others_cores():
    # nri-plugins' "one hyperthread per core for heavy compute" example, on 2 x 8 cores.
    w = world([{"name": "ai-inference", "minCPUs": 4, "minBalloons": 2, "preferNewBalloons": True, "loads": ["avx"]},
               {"name": "video-encoding", "maxCPUs": 8, "loads": ["avx"], "namespaces": ["video"]},
               {"name": "default", "maxCPUs": 16, "namespaces": ["*"]}],
              topology=machine("sockets=2,cores=8,threads=2"),
              loadClasses=[{"name": "avx", "level": "core", "overloadsLevelInBalloon": True}])
    topo = w.policy.topo
    ai = [b for b in w.policy.fleet.balloons if b.type.name == "ai-inference"]
    cores = [{topo.core_of[c] for c in b.cpus} for b in ai]
    assert all(len(c) == 4 for c in cores) and cores[0].isdisjoint(cores[1])  # a thread per core, apart
    video = w.add(G, 3000, namespace="video")
    video_cores = {topo.core_of[c] for c in w.cpus(video)}
    assert len(video_cores) == 3 and video_cores.isdisjoint(cores[0] | cores[1])
    with pytest.raises(PolicyError, match="'gpu' is not in LoadClasses"):
        world([{"name": "x", "loads": ["gpu"]}])


def test_a_resize_grows_or_shrinks_the_balloon_or_is_refused_unchanged():
    w = world([{"Name": "t", "Namespaces": ["*"], "MaxCPUs": 4}])
    a, b = w.add(B, 1000), w.add(B, 1000)
    pod = w.pods[w.containers[a.key].pod_id]
    bigger = w.containers[a.key].requested.with_cpus("")
    bigger.cpu_shares = 2048  # 2 CPUs
    d = w.policy.resize(w.containers[a.key], pod, bigger, w.view())
    assert len(CPUSet.parse(d.resources.cpuset_cpus)) == 3 and b.key in d.updates
    state = w.policy.export_state()
    huge = bigger.with_cpus("")
    huge.cpu_shares = 4096
    with pytest.raises(PolicyError, match="cannot grow"):
        w.policy.resize(w.containers[a.key], pod, huge, w.view())
    assert w.policy.export_state() == state


def test_a_container_asking_for_nothing_runs_on_the_reserved_cpus_when_its_type_has_no_room():
    w = world([{"Name": "default", "Namespaces": ["kube-*"]}, {"Name": "t", "Namespaces": ["*"]},
               {"Name": "solo", "MinBalloons": 1, "MinCPUs": 15}, {"Name": "reserved"}])
    with pytest.raises(PolicyError, match="balloon type t: no balloon can take 100m more"):
        w.add(B, 100)
    be = w.add(BE, 0)
    assert w.cpus(be) == w.policy.reserved and w.policy.describe_grant(be.key)["fallback"] == "reserved"
    assert balloon(w, be) == "reserved[0]" and "no balloon of type t could be had" in w.policy.fallback()[0]
    fresh = policies.create("balloons", w.policy.config, SERVER)
    fresh.restore_state(w.policy.export_state())
    assert fresh.fallback() == w.policy.fallback()
    w.remove(be)
    assert w.policy.fallback() == []


def test_reconfiguration_keeps_balloons_their_containers_still_belong_to():
    types = [{"Name": "quad", "MaxCPUs": 4, "Namespaces": ["*"]}, {"Name": "solo", "MinCPUs": 2, "MinBalloons": 1}]
    w = world(types)
    a, b = w.add(B, 1500), w.add(G, 2000)
    before = {c.key: w.cpus(c) for c in (a, b)}
    config = {"Active": "balloons", "ReservedResources": {"cpu": 1}}
    d = w.policy.reconfigure({**config, "balloons": {"BalloonTypes": [{**types[0], "MaxCPUs": 8}, types[1]]}},
                             w.view())
    assert d.updates == {} and {c.key: w.cpus(c) for c in (a, b)} == before
    d = w.policy.reconfigure({**config, "balloons": {"BalloonTypes": [{**types[0], "MinCPUs": 5, "MaxCPUs": 8},
                                                                      types[1]]}}, w.view())
    assert len(CPUSet.parse(d.updates[a.key].cpuset_cpus)) == 5
    with pytest.raises(NotImplementedError):  # a's namespace no longer matches its type
        w.policy.reconfigure({**config, "balloons": {"BalloonTypes": [{"Name": "quad", "Namespaces": ["x"]}]}},
                             w.view())
    with pytest.raises(PolicyError, match="unknown option"):
        w.policy.reconfigure({**config, "balloons": {"Bogus": 1}}, w.view())
    assert w.policy.describe_grant(a.key)["pool"] == "quad[0]"


def test_composite_balloons_take_even_shares_of_each_component_node():
    # nri-plugins' "combining balloons" example on 2 sockets x 2 nodes x 4 cores.
    node_types = [{"name": f"node{n}", "preferCloseToDevices": [f"/sys/devices/system/node/node{n}"]}
                  for n in range(4)]
    w = world([{"name": "balance-all-nodes", "components": [{"balloonType": "balance-pkg0-nodes"},
                                                            {"balloonType": "balance-pkg1-nodes"}]},
               {"name": "balance-pkg0-nodes", "components": [{"balloonType": "node0"}, {"balloonType": "node1"}]},
               {"name": "balance-pkg1-nodes", "components": [{"balloonType": "node2"}, {"balloonType": "node3"}]},
               *node_types], topology=machine("sockets=2,nodes=2,cores=4,threads=2"))
    topo = w.policy.topo
    c = w.add(G, 8000, annotations={TYPE: "balance-all-nodes"})
    per_node = [len(w.cpus(c) & topo.node_cpus(n)) for n in range(4)]
    assert per_node == [2, 2, 2, 2] and balloon(w, c) == "balance-all-nodes[0]"
    d = w.add(G, 4000, annotations={TYPE: "balance-pkg1-nodes"})
    assert [len(w.cpus(d) & topo.node_cpus(n)) for n in range(4)] == [0, 0, 2, 2]
    assert w.cpus(c).isdisjoint(w.cpus(d))
    grown = w.add(G, 4000, pod=w.pods[w.containers[c.key].pod_id], name="more")
    assert [len(w.cpus(grown) & topo.node_cpus(n)) for n in range(4)] == [3, 3, 3, 3]  # 12 CPUs, 3 per node
    state = w.policy.export_state()
    again = policies.create("balloons", w.policy.config, topo)
    again.restore_state(state)
    assert again.export_state() == state
    w.remove(grown)
    assert [len(w.cpus(c) & topo.node_cpus(n)) for n in range(4)] == [2, 2, 2, 2]


def test_component_creation_balance_balloons_makes_one_part_of_the_least_used_type():
    """nri-plugins' componentCreation: balance-balloons: each composite balloon is one balloon of the
    first component type in fewest balloons, so a node's worth of pods spreads over the nodes."""
    node_types = [{"name": f"node{n}", "preferCloseToDevices": [f"/sys/devices/system/node/node{n}"]}
                  for n in range(4)]
    w = world([{"name": "any-node", "componentCreation": "balance-balloons", "preferNewBalloons": True,
                "components": [{"balloonType": f"node{n}"} for n in range(4)]}, *node_types],
              topology=machine("sockets=2,nodes=2,cores=4,threads=2"))
    topo = w.policy.topo
    placed = [w.add(G, 2000, annotations={TYPE: "any-node"}) for _ in range(4)]
    homes = [[n for n in range(4) if w.cpus(c) <= topo.node_cpus(n)] for c in placed]
    assert homes == [[0], [1], [2], [3]]
    state = w.policy.export_state()
    again = policies.create("balloons", w.policy.config, topo)
    again.restore_state(state)
    assert again.export_state() == state
    with pytest.raises(PolicyError, match="not one of"):
        world([{"name": "x", "componentCreation": "some"}])


def test_the_reserved_balloon_grows_past_the_reserved_cpus_as_nri_plugins_lets_it():
    still = world([])  # without a reserved type of its own it stays on the reserved CPU, and says so
    held = [still.add(B, 1500, namespace="kube-system") for _ in range(2)]
    assert still.cpus(held[0]) == CPUSet.parse("0")
    assert still.policy.fallback() == ["balloon reserved[0]: its containers request 3000m on 1 CPUs 0 "
                                       "(no MinCPUs or MaxCPUs of a reserved type to grow by)"]
    w = world([{"Name": "reserved", "MinCPUs": 1}])  # reserved: CPU 0
    system = [w.add(B, 1500, namespace="kube-system") for _ in range(3)]  # 4500m: 5 CPUs
    cpus = w.cpus(system[0])
    assert len(cpus) == 5 and CPUSet.parse("0") <= cpus and all(w.cpus(c) == cpus for c in system)
    assert w.policy.fleet.free().isdisjoint(cpus)  # the CPUs it grew by are no other balloon's
    assert w.policy.fallback() == []
    w.remove(system[0])
    w.remove(system[1])
    assert len(w.cpus(system[2])) == 2  # 1500m: 2 CPUs, CPU 0 and one near it
    # MaxCPUs of the reserved type caps it: the rest is overcommitted, and said so.
    capped = world([{"Name": "reserved", "MaxCPUs": 2}])
    held = [capped.add(B, 1500, namespace="kube-system") for _ in range(3)]
    assert len(capped.cpus(held[0])) == 2
    assert capped.policy.fallback() == [f"balloon reserved[0]: its containers request 4500m on 2 CPUs "
                                        f"{capped.cpus(held[0])} (MaxCPUs 2 to grow by)"]
    state = w.policy.export_state()
    again = policies.create("balloons", w.policy.config, w.policy.topo)
    again.restore_state(state)
    assert again.export_state() == state


def test_a_pod_stays_together_where_a_balloon_holds_it_and_a_group_before_new_balloons():
    """nri-plugins: spreading a pod's containers never makes a new balloon while one holds the
    container as it is; a group's balloon takes its containers even when new balloons are preferred."""
    w = world([{"Name": "three", "Namespaces": ["*"], "MinCPUs": 3, "PreferSpreadingPods": True}])
    p = w.pod(B)
    a, b = w.add(B, 1500, pod=p, name="a"), w.add(B, 1500, pod=p, name="b")
    assert balloon(w, a) == balloon(w, b)  # 3000m in its 3 CPUs
    c = w.add(B, 1500, pod=p, name="c")  # would grow it: spread
    assert balloon(w, c) != balloon(w, a)
    g = world([{"Name": "g", "Namespaces": ["*"], "GroupBy": "ns=$pod/namespace", "PreferNewBalloons": True}])
    x, y, z = g.add(B, 100, namespace="x"), g.add(B, 100, namespace="x"), g.add(B, 100, namespace="y")
    assert balloon(g, x) == balloon(g, y) != balloon(g, z)


def test_a_type_near_a_node_keeps_the_other_types_off_it():
    """nri-plugins: PreferCloseToDevices on one type is an anti-affinity for the others."""
    topo = machine("sockets=2,nodes=2,cores=2,threads=2,numbering=linear")  # node n: 4n..4n+3
    w = world([{"Name": "near2", "PreferCloseToDevices": ["/sys/devices/system/node/node2"]},
               {"Name": "other", "Namespaces": ["*"], "MinCPUs": 2, "AllocatorTopologyBalancing": True}],
              topology=topo)
    others = [w.add(B, 1500) for _ in range(3)]  # spread where most CPUs are free, node 2 aside
    assert all(topo.node_cpus(2).isdisjoint(w.cpus(c)) for c in others)
    near = w.add(B, 3000, annotations={TYPE: "near2"})
    assert w.cpus(near) <= topo.node_cpus(2)


def test_a_running_container_whose_type_a_new_configuration_drops_is_placed_by_namespace_and_said():
    """nri-plugins takes such a configuration; the container falls back to its namespace's type. A new
    container naming a type that does not exist is still refused."""
    types = [{"Name": "gone", "MinCPUs": 1}, {"Name": "all", "Namespaces": ["*"]}]
    w = world(types)
    c = w.add(B, 1000, annotations={TYPE: "gone"})
    assert balloon(w, c) == "gone[0]"
    fresh = policies.create("balloons", {"ReservedResources": {"cpu": 1}, "balloons": {"BalloonTypes": types[1:]}},
                            SERVER)
    w.record(w.reallocate(fresh))
    assert balloon(w, c) == "all[0]"
    assert fresh.fallback() == ["balloon type gone is no longer configured: 1 container(s) annotated for it run "
                                "where their namespace puts them"]
    with pytest.raises(PolicyError, match="balloon type 'gone' does not exist"):
        w.add(B, 100, annotations={TYPE: "gone"})
    w.remove(c)
    assert fresh.fallback() == []


def test_topology_balancing_per_balloon_type():
    """nri-plugins' allocatorTopologyBalancing of one type: its new balloons go where most CPUs are
    free, while the policy's other types pack theirs into the tightest domain."""
    w = world([{"Name": "spread", "MaxCPUs": 2, "AllocatorTopologyBalancing": True},
               {"Name": "packed", "MaxCPUs": 2}])
    socket0 = CPUSet.parse("0-3,8-11")
    spread = [w.add(G, 2000, annotations={TYPE: "spread"}) for _ in range(2)]
    assert sorted(w.cpus(c) <= socket0 for c in spread) == [False, True]  # one on each socket
    w.remove(spread[0])
    w.remove(spread[1])
    packed = [w.add(G, 2000, annotations={TYPE: "packed"}) for _ in range(2)]
    assert (w.cpus(packed[0]) <= socket0) == (w.cpus(packed[1]) <= socket0)  # both on one socket
    with pytest.raises(PolicyError, match="AllocatorTopologyBalancing"):
        world([{"Name": "x", "AllocatorTopologyBalancing": "yes"}])
