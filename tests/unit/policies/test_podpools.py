"""The podpools policy: pool instances sized from the configuration, whole pods in one instance."""

from __future__ import annotations

import pytest

from resmgr import policies
from resmgr.model import QOSClass
from resmgr.policies import PolicyError
from resmgr.topology.cpuset import CPUSet
from tests.support.world import World, machine

DESKTOP = machine("cores=8,threads=2")  # cores 0-7, threads n and n+8
POOL = "pool.podpools.cri-resource-manager.intel.com"
CONFIG = {"AvailableResources": {"cpu": "cpuset:2-15"}, "ReservedResources": {"cpu": "cpuset:15"},
          "podpools": {"Pools": [{"Name": "singlecpu", "Instances": "3 CPUs", "CPU": 1, "MaxPods": 2},
                                 {"Name": "dualcpu", "FillOrder": "Packed", "Instances": "50 %", "CPU": 2,
                                  "MaxPods": 3}]}}


def test_instances_from_the_sample_configuration():
    w = World("podpools", DESKTOP, **CONFIG)
    pools = {p["name"]: CPUSet.parse(p["cpus"]) for p in w.policy.describe_pools()}
    assert [n for n in pools if "[" in n] == [f"singlecpu[{i}]" for i in range(3)] + [f"dualcpu[{i}]" for i in range(3)]
    assert pools["reserved"] == CPUSet([15]) and len(pools["default"]) == 13 - 3 - 6
    assert all(len(pools[f"dualcpu[{i}]"]) == 2 for i in range(3))


def test_a_pods_containers_share_one_instance_filled_in_order():
    w = World("podpools", DESKTOP, **CONFIG)
    pod = w.pod(QOSClass.BURSTABLE, annotations={POOL: "singlecpu"})
    a, b = w.add(QOSClass.BURSTABLE, 250, pod=pod, name="a"), w.add(QOSClass.BURSTABLE, 250, pod=pod, name="b")
    assert w.cpus(a) == w.cpus(b) and w.policy.describe_grant(a.key)["pool"] == "singlecpu[0]"
    other = w.add(QOSClass.BURSTABLE, 250, annotations={POOL: "singlecpu"})
    assert w.policy.describe_grant(other.key)["pool"] == "singlecpu[1]"  # Balanced: most room
    packed = [w.add(QOSClass.BURSTABLE, 250, annotations={"pooltype.podpools.cri-resource-manager.intel.com":
                                                             "dualcpu"}) for _ in range(4)]
    assert [w.policy.describe_grant(c.key)["pool"] for c in packed] == ["dualcpu[0]"] * 3 + ["dualcpu[1]"]
    plain, system = w.add(QOSClass.BEST_EFFORT, 0), w.add(QOSClass.BURSTABLE, 100, namespace="kube-system")
    assert w.policy.describe_grant(plain.key)["pool"] == "default" and w.cpus(system) == CPUSet([15])
    for _ in range(4):
        w.add(QOSClass.BURSTABLE, 250, annotations={POOL: "singlecpu"})
    with pytest.raises(PolicyError, match="every singlecpu pool is full"):
        w.add(QOSClass.BURSTABLE, 250, annotations={POOL: "singlecpu"})
    state = w.policy.export_state()
    again = policies.create("podpools", CONFIG, DESKTOP)
    again.restore_state(state)
    assert again.export_state() == state and again.describe_pools() == w.policy.describe_pools()


@pytest.mark.parametrize("pools, message", [
    ([{"Name": "x", "CPU": 1, "Instances": "20 CPUs"}], "need 20 CPUs"),
    ([{"Name": "x"}], "Name and CPU are required"),
    ([{"Name": "x", "CPU": "500m"}], "a whole number of CPUs"),
    ([{"Name": "x", "CPU": 1, "Instances": "many"}], "not a number of instances"),
])
def test_bad_pools_are_refused(pools, message):
    with pytest.raises(PolicyError, match=message):
        policies.create("podpools", {"podpools": {"Pools": pools}}, DESKTOP)


def test_the_documented_nested_spelling():
    p = policies.create("podpools", {"ReservedResources": {"cpu": 1}, "podpools": {"poolTypes": [
        {"name": "dualcpu", "typeResources": {"cpu": "95 %"}, "resources": {"cpu": 2}, "capacity": {"pod": 1}}]}},
        DESKTOP)
    assert sum(1 for i in p.instances if i.type == "dualcpu") == 7 and p.instances[0].max_pods == 1


def test_the_default_pools_cpus_are_set_aside_before_a_percentage_is_taken():
    """As cri-resmgr: with a default pool of 3 CPUs, 100 % of the instances is of the other CPUs."""
    p = policies.create("podpools", {"AvailableResources": {"cpu": "cpuset:2-15"}, "ReservedResources": {"cpu": 1},
                                     "podpools": {"Pools": [{"Name": "default", "CPU": 3},
                                                            {"Name": "pair", "CPU": 2, "Instances": "100 %"}]}},
                        DESKTOP)
    pools = {d["name"]: CPUSet.parse(d["cpus"]) for d in p.describe_pools()}
    assert len(pools["default"]) == 3 and sum(1 for i in p.instances if i.type == "pair") == 5  # (13 - 3) / 2
    with pytest.raises(PolicyError, match="set aside for the default pool"):
        policies.create("podpools", {"podpools": {"Pools": [{"Name": "default", "CPU": 3},
                                                            {"Name": "x", "CPU": 1, "Instances": "15 CPUs"}]}},
                        DESKTOP)


def test_a_pod_annotated_for_a_type_not_configured_runs_in_the_default_pool_with_a_notice():
    """As cri-resource-manager places it: a misspelt type, or one a new configuration dropped while
    the pod runs (re-placed under the new configuration), is not a refusal."""
    w = World("podpools", DESKTOP, **CONFIG)
    typo = w.add(QOSClass.BURSTABLE, 250, annotations={POOL: "singelcpu"})
    assert w.policy.describe_grant(typo.key)["pool"] == "default"
    assert w.policy.fallback() == ["pool type singelcpu is not configured (types: singlecpu, dualcpu): 1 container(s) "
                                   "annotated for it run in the default pool"]
    w.policy.release(typo, None)
    assert w.policy.fallback() == []

    dropped = {**CONFIG, "podpools": {"Pools": CONFIG["podpools"]["Pools"][1:]}}  # singlecpu gone
    after = World("podpools", DESKTOP, **dropped)
    running = after.add(QOSClass.BURSTABLE, 250, annotations={POOL: "singlecpu"})
    assert after.policy.describe_grant(running.key)["pool"] == "default"
    assert "pool type singlecpu is not configured" in after.policy.fallback()[0]
