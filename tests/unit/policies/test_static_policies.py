"""static and static-plus on generated topologies: placements, errors, invariants."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from resmgr import policies
from resmgr.model import Container, QOSClass
from resmgr.policies import PolicyError
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.model import CoreKind
from tests.support import world
from tests.support.world import machine

# 2 sockets x 4 cores x 2 threads: socket 0 = 0-3,8-11; socket 1 = 4-7,12-15; 7 and 15 isolated.
TOPO = machine("sockets=2,cores=4,threads=2,isolated=7;15")


def World(name: str, **config) -> world.World:  # noqa: N802 - reads like the class it builds
    return world.World(name, TOPO, **config)


def test_static_exclusive_and_default_set():
    w = World("static", ReservedResources={"cpu": "cpuset:0"})
    be = w.add(QOSClass.BEST_EFFORT, 0)
    assert w.cpus(be) == CPUSet.parse("0-6,8-14")  # isolated CPUs are not in the default set
    g = w.add(QOSClass.GUARANTEED, 2000)
    assert len(w.cpus(g)) == 2 and 0 not in w.cpus(g) and w.cpus(g).isdisjoint(TOPO.isolated)
    assert w.cpus(be) == CPUSet.parse("0-6,8-14") - w.cpus(g)  # the shared container was updated
    burst = w.add(QOSClass.BURSTABLE, 1000)
    assert w.cpus(burst) == w.cpus(be)
    w.remove(g)
    assert w.cpus(be) == CPUSet.parse("0-6,8-14") == w.cpus(burst)


def test_static_single_cpu_prefers_isolated():
    w = World("static")
    g = w.add(QOSClass.GUARANTEED, 1000)
    assert w.cpus(g) <= TOPO.isolated
    opted_out = w.add(QOSClass.GUARANTEED, 1000, annotations={
        "prefer-isolated-cpus.cri-resource-manager.intel.com": "false"})
    assert w.cpus(opted_out).isdisjoint(TOPO.isolated)


def test_static_fractional_guaranteed_is_shared():
    w = World("static")
    g = w.add(QOSClass.GUARANTEED, 1500)
    assert len(w.cpus(g)) == 14


def test_static_plus_pools():
    w = World("static-plus", ReservedResources={"cpu": 1})
    system = w.add(QOSClass.BURSTABLE, 100, namespace="kube-system")
    reserved = w.cpus(system)
    assert len(reserved) == 1 and reserved.isdisjoint(TOPO.isolated)
    small = w.add(QOSClass.BURSTABLE, 500)
    assert w.cpus(small).isdisjoint(reserved | TOPO.isolated)
    iso = w.add(QOSClass.BURSTABLE, 2000)  # any QoS class gets exclusive CPUs
    assert w.cpus(iso) == TOPO.isolated
    sliced = w.add(QOSClass.GUARANTEED, 2000)
    assert len(w.cpus(sliced)) == 2 and w.cpus(sliced).isdisjoint(w.cpus(small))
    mixed = w.add(QOSClass.BURSTABLE, 1500)
    shared_now = w.cpus(small)
    assert w.cpus(mixed) - shared_now and shared_now <= w.cpus(mixed)
    assert len(w.cpus(mixed) - shared_now) == 1


def test_static_plus_shared_containers_run_on_reserved_cpus_while_every_shared_cpu_is_exclusive():
    w = World("static-plus", ReservedResources={"cpu": "cpuset:0"})
    be = w.add(QOSClass.BEST_EFFORT, 0)
    shared = w.cpus(be)
    assert len(shared) == 13  # 16 CPUs, 2 isolated, 1 reserved
    burstable = w.add(QOSClass.BURSTABLE, 500)
    with pytest.raises(PolicyError, match="must keep 1"):  # its 500m needs a CPU
        w.add(QOSClass.GUARANTEED, 13000)
    w.remove(burstable)
    g = w.add(QOSClass.GUARANTEED, 13000)  # what the scheduler admits runs: all 13 shared CPUs
    assert w.cpus(g) == shared and w.cpus(be) == CPUSet([0])
    assert w.policy.describe_grant(be.key)["fallback"] == "reserved"
    assert {p["name"]: p for p in w.policy.describe_pools()}["shared"]["shared_elsewhere"] == 1
    assert w.policy.fallback()
    w.remove(g)
    assert w.cpus(be) == shared and not w.policy.fallback()


def test_without_reserved_cpus_static_plus_keeps_one_shared_cpu():
    w = World("static-plus")
    w.add(QOSClass.BEST_EFFORT, 0)
    with pytest.raises(PolicyError, match="must keep 1"):
        w.add(QOSClass.GUARANTEED, 14000)


@pytest.mark.parametrize("name", ["static", "static-plus"])
def test_an_adopted_container_keeps_its_exclusive_cpus_when_they_are_free(name):
    w = World(name, ReservedResources={"cpu": "cpuset:0"})
    be = w.add(QOSClass.BEST_EFFORT, 0)
    kept = w.add(QOSClass.GUARANTEED, 2000, running_on="5-6")
    assert w.cpus(kept) == CPUSet.parse("5-6")
    assert w.cpus(be).isdisjoint(w.cpus(kept))
    # CPUs someone else holds, the wrong count or reserved CPUs: allocated afresh instead.
    for running_on in ("5", "5-6", "0-1"):
        other = w.add(QOSClass.GUARANTEED, 2000, running_on=running_on)
        assert len(w.cpus(other)) == 2 and w.cpus(other).isdisjoint(w.cpus(kept) | CPUSet((0,)))
        w.remove(other)


@pytest.mark.parametrize("name", ["static", "static-plus"])
def test_a_reallocation_that_fails_keeps_the_old_grant(name):
    w = World(name)
    g = w.add(QOSClass.GUARANTEED, 2000)
    before = w.cpus(g)
    w.containers[g.key].requested = w.containers[g.key].requested.with_cpus("")
    w.containers[g.key].requested.cpu_shares = 64 * 1024  # 64 CPUs: cannot fit
    w.containers[g.key].requested.cpu_quota = 64 * 100000
    with pytest.raises(PolicyError):
        w.policy.allocate(w.containers[g.key], w.pods[g.pod_id], w.view())
    assert w.policy.cpus_of(g.key) == before and w.policy.taken() >= before


def test_requests_that_cannot_fit_name_the_container():
    w = World("static", ReservedResources={"cpu": 2})
    with pytest.raises(PolicyError, match=r"default/p1/app needs 20 exclusive CPUs"):
        w.add(QOSClass.GUARANTEED, 20000)
    assert w.containers == {}


@pytest.mark.parametrize("name", ["static", "static-plus"])
def test_bad_reserved_cpus_are_rejected(name):
    with pytest.raises(PolicyError, match="CPUs 64 are not available"):
        World(name, ReservedResources={"cpu": "cpuset:0,64"})
    with pytest.raises(PolicyError, match="ReservedResources.cpu"):
        World(name, ReservedResources={"cpu": "lots"})


@pytest.mark.parametrize("name", ["static", "static-plus"])
def test_decisions_are_deterministic(name):
    def run():
        w = World(name, ReservedResources={"cpu": 1})
        mix = [(QOSClass.GUARANTEED, 2000), (QOSClass.BURSTABLE, 500), (QOSClass.GUARANTEED, 1000),
               (QOSClass.BEST_EFFORT, 0), (QOSClass.BURSTABLE, 1500)] * 2
        placed = [w.add(q, m) for q, m in mix]
        w.remove(placed[2])
        w.add(QOSClass.GUARANTEED, 3000)
        return {k: c.resources.cpuset_cpus for k, c in w.containers.items()}

    assert run() == run()


def test_cpu_shares_follow_the_annotated_request():
    w = World("static")
    c = w.add(QOSClass.BURSTABLE, 0, annotations={
        "intel.com/resources": '{"app": {"requests": {"cpu": "1500m"}}}'})
    assert c.resources.cpu_shares == 1536


def test_grants_of_creates_in_flight_are_not_restored():
    w = World("static")
    data = w.policy.export_state()
    data["grants"]["pending:pod9:app:0"] = {"pool": "", "exclusive": "1", "milli": 1000}
    again = policies.create("static", {"Active": "static"}, TOPO)
    again.restore_state(data)
    assert again.grants == {} and 1 in again.pool_cpus()["default"]


@pytest.mark.parametrize("name", ["static", "static-plus"])
def test_state_round_trip(name):
    w = World(name, ReservedResources={"cpu": "750m"})
    g = w.add(QOSClass.GUARANTEED, 2000)
    again = policies.create(name, {"Active": name, "ReservedResources": {"cpu": "750m"}}, TOPO)
    again.restore_state(w.policy.export_state())
    assert again.cpus_of(g.key) == w.cpus(g)


class PolicyMachine(RuleBasedStateMachine):
    """Random create/release sequences must keep every policy's promises."""

    policy_name = "static"
    config: dict = {}

    def __init__(self) -> None:
        super().__init__()
        self.world = World(self.policy_name, **self.config)
        self.initial = self.world.policy.pool_cpus()
        self.live: list[Container] = []

    @rule(qos=st.sampled_from(list(QOSClass)), milli=st.sampled_from([0, 100, 500, 1000, 1500, 2000, 3000]),
          system=st.booleans())
    def create(self, qos, milli, system):
        if qos == QOSClass.BEST_EFFORT:
            milli = 0
        try:
            self.live.append(self.world.add(qos, milli, namespace="kube-system" if system else "default"))
        except PolicyError:
            pass

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 100))
    def release(self, index):
        self.world.remove(self.live.pop(index % len(self.live)))

    @invariant()
    def exclusive_cpus_are_never_shared_out(self):
        grants = self.world.policy.grants
        seen = CPUSet()
        for g in grants.values():
            assert seen.isdisjoint(g.exclusive)
            seen |= g.exclusive
        for c in self.live:
            cpus = self.world.cpus(c)
            assert cpus, "an empty cpuset would mean every CPU"
            assert cpus <= TOPO.online
            others = seen - grants[c.key].exclusive
            assert cpus.isdisjoint(others)

    @invariant()
    def reserved_cpus_only_for_the_reserved_class(self):
        policy = self.world.policy
        for c in self.live:
            g = policy.grants[c.key]
            if self.world.pods[c.pod_id].namespace == "kube-system" and self.policy_name == "static-plus":
                continue
            if g.exclusive:
                assert g.exclusive.isdisjoint(policy.reserved)
            if self.policy_name == "static-plus" and not policy.shared_elsewhere():
                assert self.world.cpus(c).isdisjoint(policy.reserved)

    def teardown(self):
        for c in list(self.live):
            self.world.remove(c)
        assert self.world.policy.grants == {}
        assert self.world.policy.pool_cpus() == self.initial


class StaticMachine(PolicyMachine):
    policy_name = "static"
    config = {"ReservedResources": {"cpu": "cpuset:0,8"}}


class StaticPlusMachine(PolicyMachine):
    policy_name = "static-plus"
    config = {"ReservedResources": {"cpu": 1}}


TestStatic = StaticMachine.TestCase
TestStatic.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestStaticPlus = StaticPlusMachine.TestCase
TestStaticPlus.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


HYBRID = machine("cores=8,threads=2,ecores=8,ecluster=4,numbering=linear")  # P 0-15 (pairs), E 16-23


@pytest.mark.parametrize("name", ["static", "static-plus"])
def test_on_a_hybrid_desktop_guaranteed_containers_get_whole_performance_cores(name):
    w = world.World(name, HYBRID, ReservedResources={"cpu": 1})
    assert w.policy.reserved_cpus() <= HYBRID.kinds[CoreKind.EFFICIENT]  # a whole (efficient) core
    g = w.add(QOSClass.GUARANTEED, 4000)
    assert w.cpus(g) == CPUSet.parse("0-3")
    e = w.add(QOSClass.GUARANTEED, 2000, annotations={
        "prefer-core-type.cri-resource-manager.intel.com/container.app": "efficient"})
    assert w.cpus(e) <= HYBRID.kinds[CoreKind.EFFICIENT] and len({HYBRID.l2_of[c] for c in w.cpus(e)}) == 1
    hidden = w.add(QOSClass.GUARANTEED, 4000, annotations={
        "hide-hyperthreads.cri-resource-manager.intel.com": "true"})
    assert w.cpus(hidden) == CPUSet.parse("4,6")  # one thread of each of its two cores
    assert w.policy.grants[hidden.key].exclusive == CPUSet.parse("4-7")
    restored = policies.create(name, {"Active": name, "ReservedResources": {"cpu": 1}}, HYBRID)
    restored.restore_state(w.policy.export_state())
    assert restored.cpus_of(hidden.key) == CPUSet.parse("4,6")


def test_static_plus_reserved_namespaces_take_globs_as_topology_aware_does():
    w = World("static-plus", ReservedResources={"cpu": 1}, ReservedPoolNamespaces=["kube-*", "monitoring"])
    system = w.add(QOSClass.BURSTABLE, 100, namespace="kube-public")
    assert w.cpus(system) == w.policy.reserved_cpus()
