"""Which CPUs each CPU class holds, as topology-aware and balloons say it to the cpu controller."""

from __future__ import annotations

from resmgr.model import QOSClass
from resmgr.topology.cpuset import CPUSet
from tests.support.world import World, machine

SNC = machine("sockets=2,nodes=2,cores=4,threads=2")


def test_topology_aware_pool_classes_follow_the_grants():
    w = World("topology-aware", SNC, ReservedResources={"cpu": 2}, **{"topology-aware": {
        "ReservedPoolCPUClass": "idle", "SharedPoolCPUClass": "normal", "DefaultExclusiveCPUClass": "turbo"}})
    before = w.policy.cpu_classes()
    assert before["idle"] == w.policy.reserved and not before["turbo"]
    assert before["normal"] == SNC.online - w.policy.reserved
    g = w.add(QOSClass.GUARANTEED, 2000)
    now = w.policy.cpu_classes()
    assert now["turbo"] == w.cpus(g) and now["normal"] == before["normal"] - w.cpus(g)
    w.policy.release(w.containers[g.key], w.view())
    assert w.policy.cpu_classes() == before  # the CPUs go back to the shared class


def test_balloons_cpu_classes_by_type_and_the_idle_class():
    w = World("balloons", SNC, ReservedResources={"cpu": 1}, **{"balloons": {
        "IdleCPUClass": "idle", "BalloonTypes": [{"Name": "fast", "Namespaces": ["fast"], "CPUClass": "turbo",
                                                   "MaxCPUs": 4}]}})
    assert w.policy.cpu_classes() == {"idle": SNC.online - w.policy.reserved}
    c = w.add(QOSClass.GUARANTEED, 2000, namespace="fast")
    classes = w.policy.cpu_classes()
    assert classes["turbo"] == w.cpus(c) and len(classes["turbo"]) == 2
    assert classes["idle"] == SNC.online - w.policy.reserved - w.cpus(c)
    assert classes["idle"] & classes["turbo"] == CPUSet()
