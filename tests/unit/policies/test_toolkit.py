"""The policy toolkit's parts: grants with undo, options read in any letter case, expressions."""

from __future__ import annotations

import pytest

from resmgr.model import Container, Pod, QOSClass
from resmgr.policies import PolicyError
from resmgr.policies.toolkit.expressions import parse_expression, substitute
from resmgr.policies.toolkit.grants import Grant, Grants
from resmgr.policies.toolkit.options import Option, case_free, read, schema
from resmgr.topology.cpuset import CPUSet


def test_grants_keep_the_taken_cpus_and_undo_a_failed_transaction():
    seen = []
    book = Grants(on_change=lambda key, g, sign: seen.append((key, sign, book.taken)))
    book.add("a", Grant("p", CPUSet.parse("0-1")))
    book.add("b", Grant("p", shared=500, on_shared=True))
    assert book.taken == CPUSet.parse("0-1") and seen[0] == ("a", 1, CPUSet.parse("0-1"))
    with pytest.raises(PolicyError), book.transaction():
        book.remove("a")
        book.add("c", Grant("p", CPUSet.parse("0-3")))
        book.add("b", Grant("q", CPUSet([4])))
        raise PolicyError("no room")
    assert book == {"a": Grant("p", CPUSet.parse("0-1")), "b": Grant("p", shared=500, on_shared=True)}
    assert book.taken == CPUSet.parse("0-1")
    with book.transaction():
        book.rename("a", "a2")
    assert "a2" in book and "a" not in book and len(book) == 2


def test_grants_read_every_persisted_form():
    static = Grant.from_dict({"pool": "default", "exclusive": "2", "milli": 1500})
    assert (static.on_shared, static.shared, static.milli) == (True, 500, 1500)
    exclusive = Grant.from_dict({"pool": "", "exclusive": "2-3", "milli": 2000})
    assert not exclusive.on_shared and exclusive.kind == "exclusive"
    older = Grant.from_dict({"pool": "socket #0", "exclusive": "", "shared": 250, "on_shared": True,
                             "reserved": False, "memory": 64, "mem_types": ["dram"]})
    assert older.milli == 250 and older.memory == 64 and Grant.from_dict(older.to_dict()) == older


OPTIONS = (Option("PinCPU", "boolean", True), Option("Names", "strings", []),
           Option("Level", "string", "", choices=("", "numa", "core")), Option("Count", "integer", 0))


def test_options_in_any_letter_case_with_clear_errors():
    assert read({"pincpu": False, "LEVEL": "NUMA", "count": "3"}, OPTIONS, "p") == {
        "PinCPU": False, "Names": [], "Level": "numa", "Count": 3}
    for section, message in (({"PinCPUs": True}, r"p.PinCPUs: unknown option \(known: PinCPU, Names"),
                             ({"PinCPU": "yes"}, "p.PinCPU: expected true or false"),
                             ({"Level": "rack"}, "not one of"),
                             ({"pinCPU": True, "PinCPU": False}, "are the same option"),
                             ([], "expected a mapping")):
        with pytest.raises(PolicyError, match=message):
            read(section, OPTIONS, "p")
    doc = schema(OPTIONS)
    assert case_free("PinCPU") in doc["patternProperties"] and doc["additionalProperties"] is False


def test_expressions_and_group_texts():
    pod = Pod(id="p", uid="u", name="web", namespace="prod", qos_class=QOSClass.BURSTABLE, labels={"team": "red"})
    c = Container(id="c", pod_id="p", name="app")
    assert parse_expression({"key": "pod/labels/team", "operator": "In", "values": ["red"]}, "x")(c, pod)
    assert substitute("${pod/namespace}-${pod/labels/team}-${pod/labels/none}", c, pod) == "prod-red-"
    with pytest.raises(PolicyError, match="unknown operator"):
        parse_expression({"key": "name", "operator": "Near"}, "x")


def test_cpu_values_exclude_cpusets_as_nri_plugins_writes_them():
    from resmgr.policies.toolkit.cpuvalues import resolve_cpus
    from tests.support.world import machine

    topo = machine("sockets=1,cores=4,threads=2")  # CPUs 0-7
    cpus = resolve_cpus({"AvailableResources": {"cpu": "exclude-cpuset:0-1"},
                         "ReservedResources": {"cpu": "exclude-cpuset:3-7"}}, topo)
    assert (cpus.available, cpus.reserved) == (CPUSet.parse("2-7"), CPUSet.parse("2"))
    with pytest.raises(PolicyError, match="AvailableResources.cpu"):
        resolve_cpus({"AvailableResources": {"cpu": "exclude-cpuset:x"}}, topo)
