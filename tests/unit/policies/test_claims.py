"""DRA claims under the topology-aware policy: devices offered, claims prepared on them, the
containers using a claim, and unprepare."""

from __future__ import annotations

import dataclasses

import pytest

from resmgr import policies
from resmgr.model import Claim, Container, ContainerState, QOSClass, Resources
from resmgr.policies import PolicyError
from resmgr.policies.toolkit.claims import NUMA_NODE, numa_attributes
from resmgr.topology.cpuset import CPUSet
from tests.support.world import World, machine

BE = QOSClass.BEST_EFFORT
TA = "topology-aware"
SNC = machine("sockets=2,nodes=2,cores=4,threads=2")  # NUMA nodes of 8 CPUs
L3 = machine("sockets=1,cores=8,threads=1,l3=4")  # one node, two L3 domains of 4 CPUs


def devices(world: World) -> dict[str, dict]:
    return {d["name"]: d for d in world.policy.devices()}


def user(world: World, *uids: str, pod=None, name: str = "app") -> Container:
    """A best-effort container using the claims (as kubelet's CDI devices name them)."""
    pod = pod or world.pod(BE)
    world.n += 1
    c = Container(id=f"c{world.n}", pod_id=pod.id, name=name, requested=Resources(cpu_shares=2),
                  claims=list(uids))
    world.record(world.place(c, pod).updates)
    c.state = ContainerState.RUNNING
    return c


def claim(uid: str, device: str, cpus: int = 0) -> Claim:
    return Claim(uid, "default", f"claim-{uid}", device, cpus)


def test_devices_are_the_numa_nodes_and_l3_domains() -> None:
    w = World(TA, SNC)
    offered = devices(w)
    assert sorted(offered) == ["numa-0", "numa-1", "numa-2", "numa-3"]
    assert offered["numa-2"]["attributes"] == {"kind": "numa", "numaNode": 2, "package": 1,
                                               "resource.kubernetes.io/numaNode": 2}  # KEP-6072's, to align by
    assert offered["numa-2"]["cpus"] == 8
    assert CPUSet.parse(offered["numa-2"]["cpuset"]) == SNC.nodes[2].cpus
    # One node folded into its socket keeps its NUMA device; its L3 pools are devices of their own.
    offered = devices(World(TA, L3))
    l3 = sorted(n for n in offered if n.startswith("l3-"))
    assert len(offered) == 3 and len(l3) == 2
    assert offered[l3[1]]["attributes"]["kind"] == "l3" and offered[l3[1]]["cpus"] == 4
    assert offered[l3[1]]["attributes"]["resource.kubernetes.io/numaNode"] == 0  # within one node


def test_a_node_and_its_l3_domains_share_counters() -> None:
    offered = devices(World(TA, L3))
    l3 = sorted(n for n in offered if n.startswith("l3-"))
    # Each domain a counter of its CPUs; the node consumes them all, so the scheduler never
    # allocates the node and one of its domains at once (KEP-4815).
    assert offered["numa-0"]["consumes"] == {"package-0": {l3[0]: 4, l3[1]: 4}}
    assert [offered[n]["consumes"] for n in l3] == [{"package-0": {l3[0]: 4}}, {"package-0": {l3[1]: 4}}]
    assert all("consumes" not in d for d in devices(World(TA, SNC)).values())  # nothing overlaps there


def test_a_claim_holds_cpus_of_its_device_and_its_users_run_there() -> None:
    w = World(TA, SNC)
    w.prepare(claim("u1", "numa-1", 4))
    held = CPUSet.parse(w.policy.describe_claim("u1")["cpus"])
    assert len(held) == 4 and held <= SNC.nodes[1].cpus
    assert devices(w)["numa-1"]["cpus"] == 8  # what it holds counts: the scheduler subtracts its claims
    a = user(w, "u1")
    assert w.cpus(a) == held and w.mems(a) == CPUSet.parse("1")
    assert w.containers[a.key].resources.cpu_shares == 4096
    # A second user splits its CPU time; when one goes the other has it all again.
    b = user(w, "u1")
    assert w.cpus(b) == held
    assert w.containers[a.key].resources.cpu_shares == w.containers[b.key].resources.cpu_shares == 2048
    assert w.containers[a.key].pending  # pushed to the runtime
    w.remove(w.containers[b.key])
    assert w.containers[a.key].resources.cpu_shares == 4096
    # Shared containers of the node do not run on a claim's CPUs.
    shared = w.add(BE, 0)
    assert w.cpus(shared).isdisjoint(held)


def test_a_claim_without_an_amount_takes_what_the_device_can_give() -> None:
    w = World(TA, SNC)
    w.prepare(claim("whole", "numa-0"))
    assert CPUSet.parse(w.policy.describe_claim("whole")["cpus"]) == SNC.nodes[0].cpus
    # Booked once, by the policy: as kubelet asked (the whole device), and what it holds.
    assert w.policy.prepared_claims()["whole"].cpus == 0 and w.policy.dra.book.held["whole"] == 8


def test_refusals_name_what_is_wrong() -> None:
    w = World(TA, SNC)
    with pytest.raises(PolicyError, match="device numa-0 can give 8 CPU\\(s\\), the claim asks for 9"):
        w.prepare(claim("big", "numa-0", 9))
    with pytest.raises(PolicyError, match="no device numa-7"):
        w.prepare(claim("x", "numa-7", 1))
    assert not w.policy.prepared_claims() and not w.policy.grants
    w.prepare(claim("a", "numa-0", 1))
    w.prepare(claim("b", "numa-1", 1))
    with pytest.raises(PolicyError, match="claim default/claim-a and claim default/claim-b: a container can take"):
        user(w, "a", "b")
    with pytest.raises(PolicyError, match="uses claim zz, which is not prepared"):
        user(w, "zz")
    with pytest.raises(PolicyError, match="prepared on device numa-0, not numa-2"):
        w.prepare(claim("a", "numa-2", 1))
    w.prepare(claim("a", "numa-0", 1))  # kubelet asking again: nothing changes


def test_unprepared_while_used_the_cpus_go_with_the_last_user() -> None:
    w = World(TA, SNC)
    w.prepare(claim("u", "numa-3", 2))
    a = user(w, "u")
    held = w.cpus(a)
    w.unprepare("u")
    assert "u" not in w.policy.prepared_claims()
    assert w.policy.describe_claim("u")["unprepared"]
    assert devices(w)["numa-3"]["cpus"] == 8
    assert held <= w.policy.grants.taken  # still its own
    w.remove(w.containers[a.key])
    assert w.policy.describe_claim("u") is None and not w.policy.grants.taken


def test_claims_survive_export_and_restore() -> None:
    w = World(TA, SNC)
    w.prepare(claim("u", "numa-2", 3))
    a = user(w, "u")
    fresh = policies.create(TA, {"Active": TA}, SNC)
    fresh.restore_state(w.policy.export_state())
    assert fresh.describe_claim("u") == w.policy.describe_claim("u")
    assert fresh.describe_grant(a.key) == w.policy.describe_grant(a.key)
    assert fresh.devices() == w.policy.devices()


def test_a_policy_switch_prepares_the_claims_again() -> None:
    w = World(TA, SNC)
    w.prepare(claim("u", "numa-2", 3))
    a = user(w, "u")
    again = policies.create(TA, {"Active": TA, TA: {"PinMemory": False}}, SNC)
    w.reallocate(again)
    assert w.policy is again and len(CPUSet.parse(again.describe_claim("u")["cpus"])) == 3
    assert w.containers[a.key].resources.cpuset_cpus == again.describe_claim("u")["cpus"]
    assert dataclasses.asdict(w.policy.prepared_claims()["u"])["device"] == "numa-2"


def test_a_whole_device_claim_stays_whole_across_restore_and_switch() -> None:
    w = World(TA, SNC)
    w.prepare(claim("whole", "numa-1"))
    fresh = policies.create(TA, {"Active": TA}, SNC)
    fresh.restore_state(w.policy.export_state())
    assert fresh.prepared_claims()["whole"].cpus == 0 and fresh.dra.book.held["whole"] == 8
    w.reallocate(policies.create(TA, {"Active": TA, TA: {"PinMemory": False}}, SNC))
    assert w.policy.prepared_claims()["whole"].cpus == 0


def test_claims_written_before_the_asked_amount_was_kept_restore_as_held() -> None:
    w = World(TA, SNC)
    w.prepare(claim("u", "numa-2", 3))
    data = w.policy.export_state()
    for d in data["claims"].values():  # as 0.1.0 writes them: the CPUs held, nothing else
        del d["asked"]
    fresh = policies.create(TA, {"Active": TA}, SNC)
    fresh.restore_state(data)
    assert fresh.prepared_claims()["u"].cpus == 3 and fresh.describe_claim("u") == w.policy.describe_claim("u")


# -- balloons ---------------------------------------------------------------------------------------
BALLOONS = {"ReservedResources": {"cpu": "cpuset:0"}, "BalloonTypes": [
    {"Name": "dra-numa", "MinBalloons": 2, "MaxCPUs": 4, "DRA": {}, "PreferSpreadOnPhysicalCores": False},
    {"Name": "fixed", "MinBalloons": 1, "MinCPUs": 2, "MaxCPUs": 4, "DRA": {"DeviceName": "Fixed Size"}},
    {"Name": "plain", "Namespaces": ["plain"]}]}


def balloons() -> World:
    return World("balloons", SNC, balloons=BALLOONS)


def balloon_of(w: World, key: str) -> dict:
    return next(p for p in w.policy.describe_pools() if p["name"] == w.policy.where[key].name)


def test_balloon_types_marked_for_dra_are_devices() -> None:
    w = balloons()
    offered = devices(w)
    assert sorted(offered) == ["dra-numa-0", "dra-numa-1", "fixed-size-0"]
    assert offered["dra-numa-1"]["attributes"] == {"kind": "balloon", "balloonType": "dra-numa", "instance": 1}
    assert offered["dra-numa-0"]["cpus"] == 4 and offered["fixed-size-0"]["cpus"] == 4
    # Without a minimum a DRA balloon holds nothing until claimed.
    assert [len(b.cpus) for b in w.policy.fleet.balloons if b.type.name == "dra-numa"] == [0, 0]


@pytest.mark.parametrize("dra_type, error", [
    ({"Name": "x", "MaxCPUs": 2, "DRA": {}}, "needs MinBalloons"),
    ({"Name": "x", "MinBalloons": 1, "DRA": {}}, "needs MinBalloons .* and MaxCPUs"),
    ({"Name": "x", "MinBalloons": 1, "MaxCPUs": 2, "Namespaces": ["a"], "DRA": {}}, "cannot have Namespaces"),
    ({"Name": "default", "MinBalloons": 1, "MaxCPUs": 2, "DRA": {}}, "default balloon type cannot be"),
])
def test_a_dra_type_that_cannot_work_is_refused(dra_type: dict, error: str) -> None:
    with pytest.raises(PolicyError, match=error):
        World("balloons", SNC, balloons={"BalloonTypes": [dra_type]})


def test_a_claim_inflates_its_balloon_and_its_release_deflates_it() -> None:
    w = balloons()
    w.prepare(claim("u", "dra-numa-1", 3))
    assert len(w.policy.describe_claim("u")["cpus"].split(",")) >= 1
    held = CPUSet.parse(w.policy.describe_claim("u")["cpus"])
    assert len(held) == 3
    a = user(w, "u")
    assert w.cpus(a) == held and w.containers[a.key].resources.cpu_shares == 3072
    b = user(w, "u")
    assert w.containers[a.key].resources.cpu_shares == w.containers[b.key].resources.cpu_shares == 1536
    w.remove(w.containers[b.key])
    assert w.containers[a.key].resources.cpu_shares == 3072
    w.remove(w.containers[a.key])
    w.unprepare("u")
    assert [len(b.cpus) for b in w.policy.fleet.balloons if b.type.name == "dra-numa"] == [0, 0]
    # A claim naming no amount takes the whole balloon; one with a minimum keeps it.
    w.prepare(claim("whole", "dra-numa-0"))
    assert len(CPUSet.parse(w.policy.describe_claim("whole")["cpus"])) == 4
    w.prepare(claim("f", "fixed-size-0", 1))
    w.unprepare("f")
    assert len(next(b for b in w.policy.fleet.balloons if b.type.name == "fixed").cpus) == 2


def test_contradicting_requests_are_refused_by_name() -> None:
    w = balloons()
    w.prepare(claim("a", "dra-numa-0", 1))
    w.prepare(claim("b", "dra-numa-1", 1))
    with pytest.raises(PolicyError, match="claim default/claim-a on balloon dra-numa\\[0\\] and claim default/claim-b "
                                          "on balloon dra-numa\\[1\\]: a container runs in one balloon"):
        user(w, "a", "b")
    annotated = w.pod(BE, annotations={"balloon.balloons.resource-policy.nri.io": "plain"})
    with pytest.raises(PolicyError, match="annotation names type plain, but claim default/claim-a is on balloon "
                                          "dra-numa\\[0\\] of type dra-numa"):
        user(w, "a", pod=annotated)
    with pytest.raises(PolicyError, match="balloon type dra-numa is published as DRA devices"):
        w.add(BE, 0, annotations={"balloon.balloons.resource-policy.nri.io": "dra-numa"})
    w.prepare(claim("a2", "dra-numa-0", 1))
    both = user(w, "a", "a2")  # two claims on one balloon: fine
    assert len(w.cpus(both)) == 2


def test_balloon_claims_survive_export_and_restore() -> None:
    w = balloons()
    w.prepare(claim("u", "dra-numa-1", 2))
    a = user(w, "u")
    fresh = policies.create("balloons", {"Active": "balloons", "balloons": BALLOONS}, SNC)
    fresh.restore_state(w.policy.export_state())
    assert fresh.describe_claim("u") == w.policy.describe_claim("u")
    assert fresh.describe_grant(a.key) == w.policy.describe_grant(a.key)
    assert fresh.devices() == w.policy.devices()
    # A configuration whose type of the claim's balloon is no longer published cannot take the state over.
    types = [{**t, "DRA": None} if t["Name"] == "dra-numa" else t for t in BALLOONS["BalloonTypes"]]
    other = policies.create("balloons", {"Active": "balloons", "balloons": {**BALLOONS, "BalloonTypes": types}}, SNC)
    with pytest.raises(PolicyError, match="was on a balloon this configuration has not"):
        other.restore_state(w.policy.export_state())


# -- static and static-plus -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["static", "static-plus"])
def test_pool_policies_offer_their_numa_nodes(name: str) -> None:
    w = World(name, SNC, ReservedResources={"cpu": "cpuset:0"})
    offered = devices(w)
    assert sorted(offered) == ["numa-0", "numa-1", "numa-2", "numa-3"]
    assert offered["numa-1"]["attributes"] == {"kind": "numa", "numaNode": 1, "package": 0,
                                               "resource.kubernetes.io/numaNode": 1}
    # The reserved CPU is no device's; the shared pool keeps what its users need.
    assert offered["numa-1"]["cpus"] == 8
    assert CPUSet.parse(offered["numa-0"]["cpuset"]) == SNC.nodes[0].cpus - CPUSet((0,))
    shared = w.add(BE, 0)
    before = w.cpus(shared)

    # A claim takes CPUs of its node off the shared pool (its containers move), its users run there.
    w.record(w.prepare(claim("u", "numa-1", 3)).updates)
    held = CPUSet.parse(w.policy.describe_claim("u")["cpus"])
    assert len(held) == 3 and held <= SNC.nodes[1].cpus
    assert w.cpus(shared) == before - held and w.containers[shared.key].pending
    assert devices(w)["numa-1"]["cpus"] == 8  # what it holds counts: the scheduler subtracts its claims
    a, b = user(w, "u"), user(w, "u")
    assert w.cpus(a) == w.cpus(b) == held
    assert w.containers[a.key].resources.cpu_shares == w.containers[b.key].resources.cpu_shares == 1536
    assert w.policy.describe_grant(a.key)["kind"] == "claim"

    # It survives a restart, with its users.
    fresh = policies.create(name, {"Active": name, "ReservedResources": {"cpu": "cpuset:0"}}, SNC)
    fresh.restore_state(w.policy.export_state())
    assert fresh.describe_claim("u") == w.policy.describe_claim("u")
    assert fresh.devices() == w.policy.devices()
    assert fresh.cpus_of(a.key) == held

    # Unprepared while used, the CPUs stay until the last user goes; then the shared pool has them back.
    w.record(w.unprepare("u").updates)
    w.remove(w.containers[a.key])
    assert w.containers[b.key].resources.cpu_shares == 3072
    assert held <= w.policy.grants.taken
    w.remove(w.containers[b.key])
    assert w.policy.describe_claim("u") is None and w.cpus(shared) == before


def test_a_pool_policy_refuses_what_its_devices_cannot_give() -> None:
    w = World("static", SNC, ReservedResources={"cpu": "cpuset:0"})
    with pytest.raises(PolicyError, match="device numa-0 can give 7 CPU\\(s\\), the claim asks for 8"):
        w.prepare(claim("big", "numa-0", 8))
    with pytest.raises(PolicyError, match="no device numa-9"):
        w.prepare(claim("x", "numa-9", 1))
    w.prepare(claim("whole", "numa-2"))  # no amount: the whole node
    assert len(CPUSet.parse(w.policy.describe_claim("whole")["cpus"])) == 8
    assert devices(w)["numa-2"]["cpus"] == 8
    # A Guaranteed container does not get the claim's CPUs.
    g = w.add(QOSClass.GUARANTEED, 2000)
    assert w.cpus(g).isdisjoint(CPUSet.parse(w.policy.describe_claim("whole")["cpus"]))


def test_a_pool_policy_offers_each_cpu_in_individual_mode() -> None:
    w = World("static", SNC, ReservedResources={"cpu": "cpuset:0"}, static={"DRADevices": "cpu"})
    offered = devices(w)
    assert sorted(offered, key=lambda n: int(n.split("-")[1])) == [f"cpu-{c}" for c in range(1, 32)]
    five = SNC.cpus[5]
    assert offered["cpu-5"]["attributes"] == {"kind": "cpu", "cpuID": 5, "coreID": five.core, "die": 0,
                                              "numaNode": five.node, "package": five.package,
                                              "resource.kubernetes.io/numaNode": five.node}
    assert offered["cpu-5"]["cpus"] == 1 and offered["cpu-5"]["cpuset"] == "5"
    # A claim holds its CPU, whatever it asks of it; the CPU still counts as the device's.
    w.prepare(claim("u", "cpu-5"))
    assert w.policy.describe_claim("u")["cpus"] == "5" and devices(w)["cpu-5"]["cpus"] == 1
    with pytest.raises(PolicyError, match="device cpu-5 can give 0 CPU\\(s\\), the claim asks for 1"):
        w.prepare(claim("v", "cpu-5", 1))
    with pytest.raises(PolicyError, match="device cpu-6 can give 1 CPU\\(s\\), the claim asks for 2"):
        w.prepare(claim("v", "cpu-6", 2))
    assert w.cpus(user(w, "u")) == CPUSet((5,))
    # CPUs a container holds are no device's to give.
    g = w.add(QOSClass.GUARANTEED, 2000)
    assert all(devices(w)[f"cpu-{c}"]["cpus"] == 0 for c in w.cpus(g))


def test_a_pool_policy_offers_whole_cores_in_core_mode() -> None:
    w = World("static-plus", SNC, ReservedResources={"cpu": "cpuset:0"}, **{"static-plus": {"DRADevices": "Core"}})
    offered = devices(w)
    cores = sorted((t for t in SNC.cores.values() if 0 not in t), key=min)
    assert sorted(offered) == sorted(f"core-{min(t)}" for t in cores)  # the reserved CPU's core is not whole
    first = cores[0]
    name = f"core-{min(first)}"
    assert offered[name]["cpus"] == 2 and CPUSet.parse(offered[name]["cpuset"]) == first
    assert offered[name]["attributes"]["kind"] == "core" and "cpuID" not in offered[name]["attributes"]
    w.prepare(claim("u", name, 1))  # a core is taken whole
    assert CPUSet.parse(w.policy.describe_claim("u")["cpus"]) == first
    fresh = policies.create("static-plus", {"Active": "static-plus", "ReservedResources": {"cpu": "cpuset:0"},
                                            "static-plus": {"DRADevices": "core"}}, SNC)
    fresh.restore_state(w.policy.export_state())
    assert fresh.devices() == w.policy.devices()


def test_a_pool_policy_refuses_an_unknown_device_mode() -> None:
    with pytest.raises(PolicyError, match="policy.static.DRADevices: 'socket' is not one of numa, core, cpu"):
        policies.create("static", {"Active": "static", "static": {"DRADevices": "socket"}}, SNC)


def test_claims_make_balloons_up_to_max_balloons() -> None:
    types = [{"Name": "on-demand", "MaxBalloons": 2, "MaxCPUs": 4, "DRA": {}}]
    w = World("balloons", SNC, ReservedResources={"cpu": "cpuset:0"}, balloons={"BalloonTypes": types})
    # No balloon yet: each one a claim may make is a device.
    assert not [b for b in w.policy.fleet.balloons if b.type.name == "on-demand"]
    assert {n: (d["cpus"], d["cpuset"]) for n, d in devices(w).items()} == {"on-demand-0": (4, ""),
                                                                             "on-demand-1": (4, "")}
    w.prepare(claim("b", "on-demand-1", 2))  # the second, though the first is not made
    made = [(b.index, len(b.cpus)) for b in w.policy.fleet.balloons if b.type.name == "on-demand"]
    assert made == [(1, 2)] and w.policy.describe_claim("b")["balloon"] == "on-demand[1]"
    assert CPUSet.parse(devices(w)["on-demand-1"]["cpuset"]) == CPUSet.parse(w.policy.describe_claim("b")["cpus"])
    a = user(w, "b")
    assert w.cpus(a) == CPUSet.parse(w.policy.describe_claim("b")["cpus"])
    # It survives a restart.
    fresh = policies.create("balloons", {"Active": "balloons", "ReservedResources": {"cpu": "cpuset:0"},
                                         "balloons": {"BalloonTypes": types}}, SNC)
    fresh.restore_state(w.policy.export_state())
    assert fresh.describe_claim("b") == w.policy.describe_claim("b") and fresh.devices() == w.policy.devices()
    # Its claim and user gone, the balloon goes: the device is one to come again.
    w.unprepare("b")
    w.remove(w.containers[a.key])
    assert not [b for b in w.policy.fleet.balloons if b.type.name == "on-demand"]
    assert devices(w)["on-demand-1"]["cpuset"] == ""
    with pytest.raises(PolicyError, match="no device on-demand-2 .*on-demand-0, on-demand-1"):
        w.prepare(claim("c", "on-demand-2", 1))
    with pytest.raises(PolicyError, match="a new on-demand balloon cannot take 9 CPU"):
        w.prepare(claim("d", "on-demand-0", 9))


# -- podpools -----------------------------------------------------------------------------------------
PODPOOLS = {"AvailableResources": {"cpu": "cpuset:2-15"}, "ReservedResources": {"cpu": "cpuset:15"},
            "podpools": {"Pools": [{"Name": "dualcpu", "Instances": 2, "CPU": 2, "MaxPods": 2}]}}


def test_podpools_offers_its_pool_instances() -> None:
    desktop = machine("cores=8,threads=2")
    w = World("podpools", desktop, **PODPOOLS)
    offered = devices(w)
    assert sorted(offered) == ["dualcpu-0", "dualcpu-1"]
    assert offered["dualcpu-1"]["attributes"] == {"kind": "podpool", "poolType": "dualcpu", "instance": 1,
                                                  "numaNode": 0, "package": 0, "resource.kubernetes.io/numaNode": 0}
    assert offered["dualcpu-1"]["cpus"] == 2
    pool = next(p for p in w.policy.describe_pools() if p["name"] == "dualcpu[1]")

    # Two claims book both places of the instance: a third, or an annotated pod, finds it full.
    w.prepare(claim("a", "dualcpu-1"))
    w.prepare(claim("b", "dualcpu-1", 1))
    with pytest.raises(PolicyError, match="pool dualcpu\\[1\\] holds its 2 pods"):
        w.prepare(claim("c", "dualcpu-1"))
    with pytest.raises(PolicyError, match="device dualcpu-0 has 2 CPU\\(s\\), the claim asks for 3"):
        w.prepare(claim("d", "dualcpu-0", 3))
    # The claim's containers run in the instance; their pod takes the place the claim booked.
    a = user(w, "a")
    assert w.cpus(a) == CPUSet.parse(pool["cpus"])
    assert w.policy.describe_claim("a")["users"] == [a.key]
    annotated = w.pod(BE, annotations={"pool.podpools.cri-resource-manager.intel.com": "other"})
    with pytest.raises(PolicyError, match="annotation names pool type other, but claim default/claim-b is on "
                                          "pool dualcpu\\[1\\]"):
        user(w, "b", pod=annotated)

    # Kept through a restart.
    fresh = policies.create("podpools", {"Active": "podpools", **PODPOOLS}, desktop)
    fresh.restore_state(w.policy.export_state())
    assert fresh.describe_claim("a") == w.policy.describe_claim("a") and fresh.devices() == w.policy.devices()

    # Unprepared while used, the place goes with the last user.
    w.unprepare("a")
    assert w.policy.describe_claim("a")["unprepared"]
    w.remove(w.containers[a.key])
    assert w.policy.describe_claim("a") is None
    w.prepare(claim("c", "dualcpu-1"))  # room again


def test_a_device_spanning_numa_nodes_lists_them() -> None:
    both = SNC.nodes[0].cpus | SNC.nodes[1].cpus
    assert numa_attributes(SNC, both) == {NUMA_NODE: [0, 1]}
    assert numa_attributes(SNC, SNC.nodes[3].cpus) == {"numaNode": 3, "package": 1, NUMA_NODE: 3}
