"""Cluster-native operation against the real kube-apiserver: configuration as custom resources with
per-node status and Events, and the node's NodeResourceTopology next to `cri-resmgr status`."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from kubernetes.client.rest import ApiException

from harness.containerd import TOOLS_BIN
from resmgr.agent import resources as rs
from tests.support.agentenv import NS, Env, cpu, healthy_again, matches_status, milli, policy_map, status_doc, wait_for
from tests.support.helpers import ONLINE, ROOT, Cri, container_config, fill, pod_config, resources


def entry_is(env: Env, name: str, status: str) -> dict:
    return wait_for(lambda: (e := env.cluster.node_entry(name)).get("status") == status and e,
                    what=f"{name}: {status}")


def counts_are(env: Env, name: str, success: int, failure: int) -> dict:
    """The tally's counts in a resource's status."""
    return wait_for(lambda: ((st := env.cluster.resource_object(name).get("status") or {}).get("success"),
                             st.get("failure")) == (success, failure) and st,
                    what=f"{name}: {success} success, {failure} failure")


def test_resources_by_level_with_per_node_status_events_and_columns(env):
    env.start_relay()
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("static"))
    env.cluster.resource("default", {"policy": {"Active": "static-plus"}})
    env.agent.start()
    env.cluster.start_tally(env.workdir)
    # At the same level the resource wins over the ConfigMap.
    wait_for(lambda: env.active() == "static-plus", what="the default resource")
    entry = entry_is(env, "default", rs.SUCCESS)
    assert entry["generation"] == 1 and "error" not in entry and entry["timestamp"]
    status = counts_are(env, "default", 1, 0)
    assert (status["pending"], status["failures"], status["observedGeneration"]) == (0, [], 1)
    tally = env.cluster.tally
    assert tally is not None
    # Ready once the write and its Events are through, a moment after the status is visible.
    wait_for(lambda: tally.ready_file.exists(), timeout=15, what="the tally's readiness file")  # its probe
    assert env.node_status()["kind"] == rs.KIND and env.node_status()["name"] == f"{NS}/default"
    assert "HTTP/2 connection to https://" in env.agent.log()  # every watch and write on one connection
    owner = env.cluster.node_status_object()["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("Node", env.cluster.node_object()["metadata"]["uid"])

    # A group's resource applies once the node carries the group label; the node leaves the
    # default's status as it goes.
    env.cluster.resource("group.gold", {"policy": {"Active": "topology-aware",
                                                   "topology-aware": {"PinMemory": False}}})
    time.sleep(0.5)
    assert env.active() == "static-plus"
    env.label("gold")
    wait_for(lambda: env.active() == "topology-aware", what="the group resource")
    entry_is(env, "group.gold", rs.SUCCESS)
    wait_for(lambda: env.cluster.node_entry("default") == {}, what="the node gone from the default's status")
    counts_are(env, "default", 0, 0)
    assert "PinMemory: false" in env.status().config

    # A node's ConfigMap is more specific than a group's resource.
    env.cluster.configmap(NS, f"cri-resmgr-config.node.{env.node}", policy_map("none"))
    wait_for(lambda: env.active() == "none", what="the node ConfigMap")
    wait_for(lambda: env.cluster.node_entry("group.gold") == {}, what="the node gone from the group's status")
    env.cluster.delete_configmap(NS, f"cri-resmgr-config.node.{env.node}")
    wait_for(lambda: env.active() == "topology-aware", what="back to the group resource")

    # An unknown option passes the API server (it keeps unknown fields) and is rejected by the node,
    # with its path in the resource, the generation it judged, an Event; the node keeps what it had.
    env.cluster.resource("group.gold", {"policy": {"Active": "topology-aware",
                                                   "topology-aware": {"PinMemory": False, "NoSuchOption": True}}})
    entry = entry_is(env, "group.gold", rs.FAILURE)
    assert entry["generation"] == 2
    assert entry["error"].startswith("spec.policy.topology-aware.NoSuchOption: unknown key"), entry["error"]
    assert env.active() == "topology-aware" and "NoSuchOption" not in env.status().config
    failures = counts_are(env, "group.gold", 0, 1)["failures"]
    assert [(f["node"], f["generation"]) for f in failures] == [(env.node, 2)]
    assert failures[0]["error"] == entry["error"]
    event = wait_for(lambda: env.cluster.resource_events("group.gold"), what="an Event")[0]
    assert (event["type"], event["reason"]) == ("Warning", "ConfigRejected")
    assert event["involvedObject"]["apiVersion"] == f"{rs.GROUP}/{rs.VERSION}"
    assert env.node in event["message"] and "NoSuchOption" in event["message"]

    # What the schema can say, the API server checks itself.
    with pytest.raises(ApiException) as info:
        env.cluster.resource("default", {"rdt": {"options": {"mode": "Sideways"}}})
    assert info.value.status == 422 and "spec.rdt.options.mode" in info.value.body

    # kubectl shows the policy and the counts in its columns.
    out = subprocess.run([str(TOOLS_BIN / "kubectl"), "--kubeconfig", str(env.cluster.control.admin_kubeconfig),
                          "-n", NS, "get", "rmconfig"], capture_output=True, text=True, timeout=30, check=True).stdout
    rows = {line.split()[0]: line.split()[1:4] for line in out.splitlines()}
    assert rows["NAME"] == ["POLICY", "SUCCESS", "FAILURE"]
    assert rows["default"] == ["static-plus", "0", "0"] and rows["group.gold"] == ["topology-aware", "0", "1"]

    # Fixed: judged again, and the error is gone.
    env.cluster.resource("group.gold", {"policy": {"Active": "topology-aware"}})
    entry = entry_is(env, "group.gold", rs.SUCCESS)
    assert entry["generation"] == 3 and "error" not in entry


@pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")
def test_node_resource_topology_follows_containers_and_matches_status(env, containerd):
    env.cluster.resource("default", {"policy": {"Active": "static"}})
    env.start_relay(containerd.socket, "state", "--metrics-address", f"unix:{env.workdir / 'view.sock'}")
    env.agent.start("--export-topology", "on", "--topology-interval", "0.2")
    wait_for(lambda: env.active() == "static", what="the static policy")
    nrt = wait_for(lambda: (t := env.cluster.topology()) and matches_status(t, status_doc(env.config_socket)) and t,
                   what="a NodeResourceTopology that matches cri-resmgr status")
    node = env.cluster.node_object()
    assert nrt["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    before = sum(milli(cpu(z)["available"]) for z in nrt["zones"] if z["type"] == "Node")
    capacity = sum(int(cpu(z)["capacity"]) for z in nrt["zones"] if z["type"] == "Node" and z["resources"])
    assert capacity == len(ONLINE)

    via = Cri(env.relay.socket)
    try:
        cfg = pod_config(qos="guaranteed", logdir=str(env.workdir / "logs"))
        pod = via.run_pod(cfg)
        via.run_container(pod, cfg, container_config(resources=resources(1000, True)))
        # One exclusive CPU less available, in both views.
        nrt = wait_for(lambda: (t := env.cluster.topology()) and matches_status(t, s := status_doc(env.config_socket))
                       and any(p["stats"]["exclusive_grants"] for p in s["pools"]) and t,
                       what="the exclusive CPU in the NodeResourceTopology")
        assert sum(milli(cpu(z)["available"]) for z in nrt["zones"] if z["type"] == "Node") == before - 1000
        via.remove_pod(pod)
        wait_for(lambda: (t := env.cluster.topology()) and matches_status(t, s := status_doc(env.config_socket))
                 and not any(p["stats"]["exclusive_grants"] for p in s["pools"]),
                 what="the CPU given back in the NodeResourceTopology")
    finally:
        via.close()


def test_a_full_state_directory_is_reported_in_the_probe_and_the_node_status_until_there_is_room(env):
    """What cri-resmgr reports wrong beyond its configuration reaches where an operator looks: the
    agent's probe fails and the node's ResourceManagerNodeStatus lists it, both cleared once it is over."""
    state = env.workdir / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(state)], check=True)
    try:
        env.start_relay()
        env.cluster.resource("default", {"policy": {"Active": "static"}})
        env.agent.start("--status-interval", "0.2")
        entry_is(env, "default", rs.SUCCESS)
        fill(state / "fill")
        env.cluster.resource("default", {"policy": {"Active": "static-plus"}})  # its save fails
        entry = wait_for(lambda: (e := env.cluster.node_entry("default")).get("problems") and
                         e.get("generation") == 2 and e, what="the problem in the node's status")
        assert entry["status"] == rs.SUCCESS  # taken: it runs from memory
        assert "No space left on device" in entry["problems"][0]
        probe = subprocess.run([sys.executable, "-m", "resmgr.agent", "probe", "--agent-socket", env.agent.socket],
                               capture_output=True, text=True, cwd=ROOT, timeout=30)
        assert probe.returncode == 1 and "cannot write the state" in probe.stderr, probe
        assert "cri-resmgr reports: cannot write the state" in env.agent.log()
        (state / "fill").unlink()
        wait_for(lambda: "problems" not in env.cluster.node_entry("default"), timeout=60,
                 what="the problem gone from the node's status")
        healthy_again(env)
    finally:
        if env.relay is not None:
            env.relay.stop()  # it holds the directory's lock
        subprocess.run(["umount", str(state)], check=False)
