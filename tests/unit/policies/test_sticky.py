"""Placements that outlive containers: a pod's container gets the CPUs it ran on again, after a
restart of the container or a node reboot (new sandboxes and containers, same pod UID), as
kubelet's CPU manager keeps them by pod UID and container name."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from resmgr.engine import statefile
from resmgr.model import Container, Pod, QOSClass
from resmgr.policies import PolicyError
from resmgr.topology.cpuset import CPUSet
from tests.support.world import World, machine

G, B = QOSClass.GUARANTEED, QOSClass.BURSTABLE
N4C16 = machine("sockets=2,nodes=2,cores=2,threads=2,numbering=linear")  # node n: CPUs 4n..4n+3
POOL = "pool.podpools.cri-resource-manager.intel.com"

CONFIGS = {
    "static": {},
    "static-plus": {},
    "topology-aware": {},
    "balloons": {"ReservedResources": {"cpu": 1},
                 "balloons": {"BalloonTypes": [{"Name": "app", "Namespaces": ["*"], "MaxCPUs": 2}]}},
}


def reboot(w: World, pods: list[Pod]) -> list[Pod]:
    """Every container exits; kubelet makes each pod a new sandbox (same UID, next attempt)."""
    for c in list(w.containers.values()):
        w.record(w.release(c).updates)
    return [w.add_pod(dataclasses.replace(p, id=f"{p.id}-after", attempt=p.attempt + 1, seq=0)) for p in pods]


def placed(w: World, pods: list[Pod], order: list[int], qos: QOSClass, milli: int) -> dict[int, Container]:
    return {i: w.add(qos, milli, pod=pods[i]) for i in order}


@pytest.mark.parametrize("policy", sorted(CONFIGS))
def test_a_reboot_gives_every_guaranteed_container_its_cpus_again(policy):
    w = World(policy, N4C16, **CONFIGS[policy])
    pods = [w.pod(G) for _ in range(3)]
    before = placed(w, pods, [0, 1, 2], G, 2000)
    cpus = {i: w.cpus(c) for i, c in before.items()}
    assert len(set(map(str, cpus.values()))) == 3
    new = reboot(w, pods)
    after = placed(w, new, [2, 0, 1], G, 2000)  # kubelet brings them back in any order
    assert {i: w.cpus(c) for i, c in after.items()} == cpus
    assert {i: w.mems(c) for i, c in after.items()} == {i: w.mems(c) for i, c in before.items()}


def vanish(w: World, pods: list[Pod]) -> list[Pod]:
    """The runtime lost every sandbox (a node reboot): reconciliation drops the pods; kubelet is
    to make each anew (same UID, next attempt)."""
    for p in pods:
        w.record(w.drop_pod(p, vanished=True).updates)
    return [dataclasses.replace(p, id=f"{p.id}-after", attempt=p.attempt + 1, seq=0) for p in pods]


EXCLUSIVE = ["static", "static-plus", "topology-aware"]


@pytest.mark.parametrize("policy", EXCLUSIVE)
def test_a_pod_new_to_the_node_made_before_those_of_a_reboot_takes_none_of_their_cpus(policy):
    # As kubelet's CPU manager keeps a pod's CPUs while it lives: a Guaranteed pod of the soak's
    # churn made just after a reboot took CPUs of a pod kubelet was still making again.
    w = World(policy, N4C16, **CONFIGS[policy])
    pods = [w.pod(G) for _ in range(2)]
    cpus = {i: w.cpus(c) for i, c in placed(w, pods, [0, 1], G, 2000).items()}
    back = vanish(w, pods)
    assert w.held() == cpus[0] | cpus[1]
    newcomer = w.add(G, 2000)
    assert w.cpus(newcomer).isdisjoint(cpus[0] | cpus[1])
    after = placed(w, [w.add_pod(p) for p in back], [1, 0], G, 2000)
    assert {i: w.cpus(c) for i, c in after.items()} == cpus
    assert not w.awaited and not w.held()


@pytest.mark.parametrize("policy", EXCLUSIVE)
def test_cpus_kept_for_a_pod_to_come_go_to_others_where_nothing_else_will_do(policy):
    def fill(w: World) -> list[CPUSet]:
        got = []
        with pytest.raises(PolicyError):
            for _ in range(16):
                got.append(w.cpus(w.add(G, 2000)))
        return got

    kept, removed = World(policy, N4C16, **CONFIGS[policy]), World(policy, N4C16, **CONFIGS[policy])
    for w in (kept, removed):
        pods = [w.pod(G) for _ in range(2)]
        placed(w, pods, [0, 1], G, 2000)
        if w is kept:
            vanish(w, pods)
        else:
            for p in pods:
                w.record(w.drop_pod(p).updates)
    held, taken = kept.held(), fill(kept)
    assert len(taken) == len(fill(removed))  # as many as without the pods: nobody is refused for them
    first = len(taken) - len(held) // 2
    assert all(cpus.isdisjoint(held) for cpus in taken[:first]), taken


def test_cpus_kept_for_a_pod_to_come_outlive_a_restart_and_the_previous_release_ignores_them():
    w = World("static", N4C16)
    pods = [w.pod(G)]
    c = w.add(G, 2000, pod=pods[0])
    held, identity = w.cpus(c), f"{pods[0].uid}/{c.name}"
    back = vanish(w, pods)
    saved = statefile.with_vanished(w.previous, w.vanished, w.awaited)
    assert saved[f"{identity}/held"] == str(held)
    statefile.check({"version": 1, "pods": [], "containers": [], "previous": saved})
    previous, vanished, awaited = statefile.split_vanished(saved)
    restored = World("static", N4C16)
    restored.n = 100  # its pods are not the old ones
    restored.load([], [], previous=previous, vanished=vanished, awaited=awaited)
    assert restored.held() == held
    assert restored.cpus(restored.add(G, 2000)).isdisjoint(held)
    again = restored.add(G, 2000, pod=restored.add_pod(back[0]))
    assert restored.cpus(again) == held and not restored.awaited
    # 0.1.0 reads the entry as the placement of a container named "app/held", which never comes.
    assert f"{identity}/held".partition("/")[0] == pods[0].uid


def test_a_shared_balloon_made_again_member_by_member_ends_where_it_was():
    # A node reboot under balloons kept neither Guaranteed pod's CPUs: its first member back made the
    # balloon on CPUs it had, but the balloon grew for the others onto whichever CPUs came first.
    config = {"ReservedResources": {"cpu": "cpuset:0"},
              "balloons": {"AllocatorTopologyBalancing": False,
                           "BalloonTypes": [{"Name": "app", "Namespaces": ["*"], "MaxCPUs": 6}]}}
    kinds = [(G, 2000, None), (G, 1000, None), (B, 200, 1000), (B, 300, 0)]
    for order in itertools.permutations(range(len(kinds))):
        w = World("balloons", N4C16, **config)
        pods = [w.pod(qos) for qos, _, _ in kinds]
        made = {i: w.add(qos, milli, pod=pods[i], limit=limit) for i, (qos, milli, limit) in enumerate(kinds)}
        before = {i: w.cpus(c) for i, c in made.items()}
        assert len(set(map(str, before.values()))) == 1  # one balloon
        new = reboot(w, pods)
        made = {i: w.add(kinds[i][0], kinds[i][1], pod=new[i], limit=kinds[i][2]) for i in order}
        assert {i: w.cpus(c) for i, c in made.items()} == before, order


def test_a_restarted_container_keeps_its_cpus_when_others_came_and_went():
    w = World("topology-aware", N4C16)
    first, second = w.add(G, 2000), w.add(G, 2000)
    held = w.cpus(second)
    w.record(w.release(first).updates)
    w.record(w.release(second).updates)
    again = w.add(G, 2000, pod=w.pods[second.pod_id])  # the next attempt, with the first's CPUs free
    assert w.cpus(again) == held


def test_shared_containers_go_back_to_their_pool():
    w = World("topology-aware", N4C16)
    pods = [w.pod(B) for _ in range(4)]
    before = placed(w, pods, [0, 1, 2, 3], B, 500)
    new = reboot(w, pods)
    after = placed(w, new, [3, 2, 1, 0], B, 500)
    pool = w.policy.describe_grant
    pools = [pool(after[i].key)["pool"] for i in range(4)]
    assert len(set(pools)) == 4  # spread over the nodes, and each one back where it was
    assert [CPUSet.parse(w.containers[after[i].key].resources.cpuset_cpus) for i in range(4)] == \
        [CPUSet.parse(before[i].resources.cpuset_cpus) for i in range(4)]


def test_podpools_instances_follow_the_pod():
    w = World("podpools", machine("cores=8,threads=2"), AvailableResources={"cpu": "cpuset:2-15"},
              ReservedResources={"cpu": "cpuset:15"},
              podpools={"Pools": [{"Name": "dual", "Instances": "3", "CPU": 2, "MaxPods": 1}]})
    pods = [w.pod(B, annotations={POOL: "dual"}) for _ in range(3)]
    before = placed(w, pods, [0, 1, 2], B, 500)
    new = reboot(w, pods)
    after = placed(w, new, [2, 1, 0], B, 500)
    assert {i: w.cpus(c) for i, c in after.items()} == {i: w.cpus(c) for i, c in before.items()}


def test_taken_cpus_are_not_given_twice():
    w = World("static", N4C16)
    pod = w.pod(G)
    old = w.add(G, 2000, pod=pod)
    held = w.cpus(old)
    w.record(w.release(old).updates)
    intruder = w.add(G, 2000)  # took them meanwhile (the same first choice)
    assert w.cpus(intruder) == held
    again = w.add(G, 2000, pod=pod)
    assert w.cpus(again).isdisjoint(held) and len(w.cpus(again)) == 2


def test_the_memory_goes_with_the_pods_last_sandbox_and_is_persisted():
    w = World("static", N4C16)
    pods = [w.pod(G)]
    c = w.add(G, 2000, pod=pods[0])
    new = reboot(w, pods)
    identity, held = f"{pods[0].uid}/{c.name}", w.cpus(c)
    assert w.previous == {identity: str(held)}
    w.drop_pod(pods[0])  # kubelet removes the old sandbox: the pod lives on in the new one
    assert identity in w.previous
    state = {"version": 1, "pods": [p.to_dict() for p in w.pods.values()],
             "containers": [x.to_dict() for x in w.containers.values()], "previous": dict(w.previous)}
    statefile.check(state)
    restored = World("static", N4C16)
    restored.load([Pod.from_dict(p) for p in state["pods"]], [], previous=state["previous"])
    assert restored.previous == w.previous
    again = restored.add(G, 2000, pod=restored.pods[new[0].id])
    assert again.previous == str(held) and restored.cpus(again) == held
    w.drop_pod(new[0])
    assert w.previous == {}


def test_the_none_policy_and_unpinned_containers_get_no_hint():
    w = World("none", N4C16)
    pod = w.pod(G)
    c = w.add(G, 2000, pod=pod)
    w.record(w.release(c).updates)
    assert w.previous == {} and w.add(G, 2000, pod=pod).previous == ""


@pytest.mark.parametrize("policy", EXCLUSIVE)
def test_a_container_made_again_while_cri_resmgr_was_away_after_a_reboot_is_given_its_cpus_again(policy):
    # NRI mode: containerd ran kubelet's creates after a reboot before the plugin had registered, so
    # the containers ran on every CPU and were adopted. One was placed afresh, off the CPUs kept for it.
    w = World(policy, N4C16, **CONFIGS[policy])
    pods = [w.pod(G) for _ in range(3)]
    cpus = {i: w.cpus(c) for i, c in placed(w, pods, [0, 1, 2], G, 2000).items()}
    back = vanish(w, pods)
    after = {i: w.add(G, 2000, pod=w.add_pod(back[i]), running_on="0-15") for i in (2, 0, 1)}  # every CPU
    assert {i: w.cpus(c) for i, c in after.items()} == cpus
    assert not w.awaited and not w.held()
