"""The configuration CRD's schema, the agent's choice among resources and ConfigMaps, and the
NodeResourceTopology document, without a cluster."""

from __future__ import annotations

import importlib.util

from resmgr.agent import resources as rs
from resmgr.agent.agent import NodeAgent, Settings, error_path, spec_data
from resmgr.config.document import from_map
from resmgr.config.openapi import canonical_key, convert
from resmgr.view import nrt
from tests.support.helpers import ROOT


def test_the_chart_crd_is_generated_from_the_schemas():
    spec = importlib.util.spec_from_file_location("crd", ROOT / "scripts" / "crd.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.generated() == module.PATH.read_text(), "run scripts/crd.py"
    assert module.generated(node=True) == module.NODE_PATH.read_text(), "run scripts/crd.py"


def test_structural_conversion_keeps_checks_and_never_prunes():
    schema = {
        "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}}},
        "type": "object", "additionalProperties": False,
        "properties": {
            "mode": {"enum": ["Full", "Disabled"], "description": "how"},
            "count": {"type": "integer", "minimum": 0},
            "quantity": {"type": ["string", "integer"]},
            "maybe": {"type": ["object", "null"], "additionalProperties": {"type": "boolean"}},
            "either": {"anyOf": [{"type": "string"}, {"type": "array"}]},
            "tree": {"$ref": "#/$defs/node"},
        },
        "patternProperties": {"^[Pp][iI][nN][Cc][Pp][Uu]$": {"type": "boolean"}},
    }
    out = convert(schema)
    props = out["properties"]
    assert out["x-kubernetes-preserve-unknown-fields"] is True  # a misspelt key reaches the daemon
    assert props["mode"] == {"description": "how", "type": "string", "enum": ["Full", "Disabled"]}
    assert props["count"] == {"type": "integer", "minimum": 0}
    assert props["quantity"] == {"x-kubernetes-int-or-string": True}
    assert props["maybe"] == {"type": "object", "nullable": True, "additionalProperties": {"type": "boolean"}}
    assert props["either"] == {"x-kubernetes-preserve-unknown-fields": True}
    assert props["PinCPU"] == {"type": "boolean"}
    # a recursive type stops where it would repeat: the daemon checks the rest
    assert props["tree"]["properties"]["child"] == {"x-kubernetes-preserve-unknown-fields": True, "type": "object"}
    assert "$ref" not in str(out) and "patternProperties" not in str(out)
    assert canonical_key("^[Rr][eE][sS][eE][rR][vV][eE][dD]$") == "Reserved"


def test_a_resource_spec_is_pushed_as_the_configmap_form_and_errors_name_spec_paths():
    data = spec_data({"policy": {"Active": "static", "static": {"RelaxedIsolation": True}}, "logger": {"Debug": ["x"]}})
    config = from_map(data, "ConfigMap data for node n1")
    assert config.policy_name == "static" and config.data["policy"]["static"] == {"RelaxedIsolation": True}
    err = "ConfigMap data for node n1: policy.static.Foo: unknown key"
    assert error_path(err, "n1", custom=True) == "spec.policy.static.Foo: unknown key"
    assert error_path(err, "n1", custom=False) == "policy.static.Foo: unknown key"
    assert error_path("policy static: no CPUs", "n1", custom=True) == "policy static: no CPUs"


def _obj(name: str, **body: object) -> dict:
    return {"metadata": {"name": name, "resourceVersion": "7", "generation": 2}, **body}


def test_the_most_specific_wins_and_a_resource_before_a_configmap():
    agent = NodeAgent(Settings(node_name="n1"), api=None)  # type: ignore[arg-type]
    agent.group = "gold"
    agent.maps = {"default": _obj("cri-resmgr-config.default", data={"policy": "Active: none"}),
                  "cr:default": _obj("default", spec={"policy": {"Active": "static"}})}
    assert (agent.choice().kind, agent.choice().name) == (rs.KIND, "default")
    agent.maps["group"] = _obj("cri-resmgr-config.group.gold", data={"policy": "Active: static-plus"})
    assert (agent.choice().kind, agent.choice().name) == ("ConfigMap", "cri-resmgr-config.group.gold")
    agent.maps["cr:node"] = _obj("node.n1", spec={"policy": {"Active": "topology-aware"}})
    choice = agent.choice()
    assert (choice.kind, choice.name, choice.version) == (rs.KIND, "node.n1", "2")
    agent.group = None  # not in a group any more: the group's objects do not count
    del agent.maps["cr:node"]
    assert agent.choice().name == "default"
    # A resource's status writes change its resourceVersion, not its generation: the same choice.
    same = _obj("default", spec={"policy": {"Active": "static"}})
    same["metadata"]["resourceVersion"] = "8"
    before = agent.choice()
    agent.maps["cr:default"] = same
    assert agent.choice() == before
    assert agent.map_name("cr:node") == "node.n1" and agent.map_name("node") == "cri-resmgr-config.node.n1"
    off = NodeAgent(Settings(node_name="n1", custom_resources=False), api=None)  # type: ignore[arg-type]
    off.maps = dict(agent.maps)
    assert off.choice().kind == "ConfigMap"


def _state() -> dict:
    """Two NUMA nodes of 2 CPUs; CPU 0 reserved, CPU 3 exclusive, a shared container on 1-2."""
    nodes = [{"id": 0, "kind": "DRAM", "memory": 4 << 30, "cpus": "0-1", "distances": {"0": 10, "1": 21}},
             {"id": 1, "kind": "DRAM", "memory": 4 << 30, "cpus": "2-3", "distances": {"0": 21, "1": 10}}]
    roles = ["reserved", "shared", "shared", "exclusive"]
    pools = [{"name": "shared", "parent": "", "cpus": "1-3", "shared": "1-2", "mems": "0-1",
              "stats": {"cpus": 3, "shared_cpus": 2, "exclusive_grants": 1, "containers": 2,
                        "shared_milli_requested": 500, "shared_milli_free": 1500, "shared_elsewhere": 0}}]
    containers = [
        {"state": "running", "runs_on": "3", "mems": "1", "shared_milli": 0, "exclusive": "3", "memory_limit": 1 << 30},
        {"state": "running", "runs_on": "1-2", "mems": "", "shared_milli": 500, "exclusive": "", "memory_limit": 0},
        {"state": "exited", "runs_on": "1-2", "mems": "", "shared_milli": 900, "exclusive": "", "memory_limit": 0},
    ]
    return {"policy": "static", "topology": {"online": "0-3", "nodes": nodes},
            "cpus": [{"id": i, "node": i // 2, "role": r} for i, r in enumerate(roles)],
            "pools": pools, "pods": [{"containers": containers}]}


def test_node_resource_topology_zones():
    doc = nrt.build(_state())
    z = {zone["name"]: zone for zone in doc["zones"]}
    res = {name: {r["name"]: r for r in zone["resources"]} for name, zone in z.items()}
    # node 0: CPU 0 reserved, half the shared container's 500m on CPU 1
    assert res["node-0"]["cpu"] == {"name": "cpu", "capacity": "2", "allocatable": "1", "available": "750m"}
    # node 1: CPU 3 exclusive, the other half of 500m on CPU 2; the exclusive container's memory
    assert res["node-1"]["cpu"]["available"] == "750m"
    assert res["node-1"]["memory"]["available"] == str((4 << 30) - (1 << 30))
    assert res["node-0"]["memory"]["available"] == str(4 << 30)
    assert z["node-0"]["type"] == "Node" and z["node-0"]["costs"][1] == {"name": "node-1", "value": 21}
    shared = z["shared"]
    assert shared["type"] == "Pool" and res["shared"]["cpu"]["available"] == "1500m"
    assert {a["name"]: a["value"] for a in shared["attributes"]}["exclusive-grants"] == "1"
    attributes = {a["name"]: a["value"] for a in doc["attributes"]}
    assert attributes["policy"] == "static"
    # What the scheduler plugin filters by: static promises no NUMA alignment, topology-aware does.
    assert (attributes["topologyManagerPolicy"], attributes["topologyManagerScope"]) == ("none", "container")
    aligned = {a["name"]: a["value"] for a in nrt.build({**_state(), "policy": "topology-aware"})["attributes"]}
    assert aligned["topologyManagerPolicy"] == "single-numa-node"
    assert nrt.cpu_quantity(2000) == "2" and nrt.cpu_quantity(250) == "250m"


def test_agent_intervals_must_be_positive():
    import pytest

    from resmgr.agent.main import build_parser

    assert build_parser().parse_args(["--topology-interval", "0.5"]).topology_interval == 0.5
    for bad in ("0", "-1", "soon"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--topology-interval", bad])


def test_an_agent_that_cannot_record_what_its_node_did_says_so_in_its_health():
    import asyncio

    from resmgr.agent.agent import Choice

    class Refusing:  # the API server refuses every write (RBAC, quota, an outage)
        async def annotate_node(self, annotations):
            raise RuntimeError("nodes is forbidden")

        async def put_node_status(self, namespace, status, node):
            raise RuntimeError("status is forbidden")

    agent = NodeAgent(Settings(node_name="n1"), api=None)  # type: ignore[arg-type]
    agent.cluster = Refusing()  # type: ignore[assignment]
    choice = Choice(rs.KIND, "default", "2", {"policy": "Active: none"})
    agent.relay_reachable, agent.reported = True, {"nodeobj", "cr:node", "node", "cr:default", "default"}
    assert agent.health() == ""
    agent.pushed, agent.unrecorded = choice, not asyncio.run(agent._record(choice, ""))
    assert agent.unrecorded
    assert agent.health() == ("the outcome for default is not recorded in the cluster (the node's annotation: nodes is "
                              f"forbidden; {rs.NODE_KIND} kube-system/n1: status is forbidden); retried at the next "
                              "resync")


def test_an_agent_is_not_ready_before_it_reached_cri_resmgr_and_pushed_what_applies():
    agent = NodeAgent(Settings(node_name="n1", config_socket="/run/x.sock"), api=None)  # type: ignore[arg-type]
    assert agent.health() == ("cri-resmgr not reached yet on /run/x.sock; the cluster's configuration for this node "
                              "not read yet")
    agent.relay_reachable = True
    agent.reported = {"nodeobj", "cr:node", "node", "cr:default", "default"}
    assert agent.health() == ""  # nothing applies to the node: nothing to push
    agent.maps["cr:default"] = {"metadata": {"name": "default", "generation": 1}, "spec": {}}
    assert agent.health() == "the configuration not pushed to cri-resmgr yet"
    agent.pushed = agent.choice()
    assert agent.health() == ""
    agent.relay_reachable = False
    assert agent.health() == "cri-resmgr is not reachable on /run/x.sock"


def test_the_tally_counts_the_current_generation_and_names_the_first_failures():
    from resmgr.agent.tally import counts

    config = {"metadata": {"name": "default", "generation": 3}}
    nodes = [(f"n{i:02}", {"generation": 3, "status": rs.SUCCESS}) for i in range(5)]
    nodes += [(f"f{i:02}", {"generation": 3, "status": rs.FAILURE, "error": "x" * 5000, "timestamp": "t"})
              for i in range(rs.FAILURES_LISTED + 5)]
    nodes += [("old", {"generation": 2, "status": rs.FAILURE, "error": "gone"})]
    st = counts(config, nodes)
    assert (st["success"], st["failure"], st["pending"], st["observedGeneration"]) == (5, rs.FAILURES_LISTED + 5, 1, 3)
    # Bounded however many nodes fail: the first by name, each error cut short.
    assert [f["node"] for f in st["failures"]] == [f"f{i:02}" for i in range(rs.FAILURES_LISTED)]
    assert all(len(f["error"]) == 1024 for f in st["failures"])
