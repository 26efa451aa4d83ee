"""Scheduling classes in topology-aware and balloons: who gets which class, and bad classes refused."""

from __future__ import annotations

import pytest

from resmgr.model import QOSClass, SchedulingClass
from resmgr.policies import PolicyError
from tests.support.world import World, machine

SNC = machine("sockets=2,nodes=2,cores=4,threads=2")
CLASSES = [{"Name": "rt", "Policy": "fifo", "Priority": 42, "IOClass": "rt", "IOPriority": 1},
           {"name": "batchy", "policy": "batch", "nice": 10},
           {"name": "idle-io", "ioClass": "idle"}]
ANNOTATION = "scheduling-class.resource-policy.nri.io"


def sched(w: World, c) -> str:
    return w.containers[c.key].classes.get("sched", "")


def test_topology_aware_classes_by_annotation_then_namespace_then_qos():
    w = World("topology-aware", SNC, **{"topology-aware": {
        "SchedulingClasses": CLASSES, "NamespaceSchedulingClasses": {"batch-jobs": "batchy"},
        "PodQoSSchedulingClasses": {"guaranteed": "rt", "BestEffort": "idle-io"}}})
    assert w.policy.scheduling_class("rt") == SchedulingClass("rt", "fifo", 42, io_class="rt", io_priority=1)
    assert sched(w, w.add(QOSClass.GUARANTEED, 1000)) == "rt"
    assert sched(w, w.add(QOSClass.BEST_EFFORT, 0)) == "idle-io"
    assert sched(w, w.add(QOSClass.BURSTABLE, 500)) == ""
    assert sched(w, w.add(QOSClass.GUARANTEED, 1000, namespace="batch-jobs")) == "batchy"  # namespace first
    assert sched(w, w.add(QOSClass.GUARANTEED, 1000, namespace="batch-jobs",
                          annotations={f"{ANNOTATION}/container.app": "idle-io"})) == "idle-io"
    with pytest.raises(PolicyError, match="scheduling class 'nope' is not in SchedulingClasses"):
        w.add(QOSClass.BURSTABLE, 100, annotations={ANNOTATION: "nope"})


def test_balloons_classes_by_type_an_annotation_wins():
    w = World("balloons", SNC, **{"balloons": {"SchedulingClasses": CLASSES, "BalloonTypes": [
        {"Name": "fast", "Namespaces": ["fast"], "SchedulingClass": "rt", "MaxCPUs": 4}]}})
    assert sched(w, w.add(QOSClass.GUARANTEED, 1000, namespace="fast")) == "rt"
    assert sched(w, w.add(QOSClass.GUARANTEED, 1000, namespace="fast", annotations={ANNOTATION: "batchy"})) == \
        "batchy"
    assert sched(w, w.add(QOSClass.BURSTABLE, 500)) == ""
    assert w.policy.scheduling_class("batchy") == SchedulingClass("batchy", "batch", nice=10)


@pytest.mark.parametrize("classes, extra, message", [
    ([{"name": "a", "policy": "fifo"}], {}, "policy fifo needs a Priority of 1 to 99"),
    ([{"name": "a", "policy": "batch", "priority": 3}], {}, "a Priority is only for the real-time policies"),
    ([{"name": "a", "nice": 20}], {}, "Nice: 20 is not within -20 and 19"),
    ([{"name": "a", "ioPriority": 3}], {}, "an IOPriority needs an IOClass"),
    ([{"name": "a", "policy": "deadline", "runtime": 10, "deadline": 5}], {}, "0 < Runtime <= Deadline"),
    ([{"name": "a", "policy": "realtime"}], {}, "'realtime' is not one of"),
    ([{"name": "a"}, {"name": "a"}], {}, "the name a is taken"),
    ([{"policy": "batch"}], {}, "Name is required"),
    ([{"name": "a"}], {"PodQoSSchedulingClasses": {"Premium": "a"}}, "'Premium' is not a QoS class"),
    ([{"name": "a"}], {"NamespaceSchedulingClasses": {"x": "b"}}, "scheduling class 'b' is not in"),
])
def test_bad_scheduling_classes_are_refused(classes, extra, message):
    with pytest.raises(PolicyError, match=message):
        World("topology-aware", SNC, **{"topology-aware": {"SchedulingClasses": classes, **extra}})


def test_a_balloon_type_naming_a_class_not_defined_is_refused():
    with pytest.raises(PolicyError, match=r"BalloonTypes\[0\] \(t\)\.SchedulingClass: scheduling class 'rt'"):
        World("balloons", SNC, **{"balloons": {"BalloonTypes": [{"Name": "t", "SchedulingClass": "rt"}]}})
