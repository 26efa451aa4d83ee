"""cri-resmgr-agent against a Kubernetes API test server and a real cri-resmgr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from urllib.parse import parse_qs, urlsplit

import grpc
import pytest

from resmgr.agent import resources as rs
from resmgr.generated.agent import api_pb2
from tests.support.agentenv import (
    AGENT_USER,
    NS,
    Env,
    FakeCluster,
    applied,
    healthy_again,
    policy_map,
    running_static,
    wait_for,
)
from tests.support.helpers import (
    ONLINE,
    ROOT,
    Cri,
    cgroup_cpus,
    cgroup_cpuset,
    container_config,
    pod_config,
    resources,
)


@pytest.fixture
def fake_env(workdir):
    e = Env(workdir, FakeCluster("node-1"))
    yield e
    e.close()


def test_node_group_default_precedence_and_edits(env):
    env.start_relay()
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("static"))
    env.cluster.configmap(NS, "cri-resmgr-config.group.gold", policy_map("static-plus"))
    env.agent.start()
    wait_for(lambda: env.active() == "static", what="the default map")
    wait_for(applied(env, "cri-resmgr-config.default"), what="the status annotation")
    assert env.status().source == f"agent (node {env.node})"

    env.label("gold")  # the node joins a group: its map wins over the default
    wait_for(lambda: env.active() == "static-plus", what="the group map")
    env.cluster.configmap(NS, f"cri-resmgr-config.node.{env.node}", policy_map("topology-aware"))
    wait_for(lambda: env.active() == "topology-aware", what="the node map")
    wait_for(applied(env, f"cri-resmgr-config.node.{env.node}"))

    # Editing the map in force is pushed; editing one that does not apply is not.
    env.cluster.configmap(NS, f"cri-resmgr-config.node.{env.node}",
                      policy_map("topology-aware", "topology-aware:\n  PinMemory: false\n"))
    wait_for(lambda: "PinMemory: false" in env.status().config, what="the edit")
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("none"))
    time.sleep(0.5)
    assert env.active() == "topology-aware"

    env.cluster.delete_configmap(NS, f"cri-resmgr-config.node.{env.node}")
    wait_for(lambda: env.active() == "static-plus", what="back to the group map")
    env.label("silver")  # a group without a map: the default applies
    wait_for(lambda: env.active() == "none", what="the default map again")
    env.cluster.configmap(NS, "cri-resmgr-config.group.silver", policy_map("static"))
    wait_for(lambda: env.active() == "static", what="the new group's map")
    env.label(None)
    wait_for(lambda: env.active() == "none", what="no group")

    # Only this node's objects are ever listed or watched, by name, and the shipped RBAC let every
    # request through (the API server's audit log).
    calls = env.cluster.control.audit(AGENT_USER, since=env.cluster.since)
    assert calls and [c["requestURI"] for c in calls if c["responseStatus"]["code"] == 403] == []
    reads = [urlsplit(c["requestURI"]) for c in calls if c["verb"] in ("list", "watch")]
    assert reads and {r.path for r in reads} == {"/api/v1/nodes", f"/api/v1/namespaces/{NS}/configmaps",
                                                 f"/apis/{rs.GROUP}/{rs.VERSION}/namespaces/{NS}/{rs.PLURAL}"}
    names = {parse_qs(r.query).get("fieldSelector", [""])[0] for r in reads}
    levels = ("default", f"node.{env.node}", "group.gold", "group.silver")
    assert names <= {f"metadata.name={n}" for n in (env.node, *levels, *(f"cri-resmgr-config.{n}" for n in levels))}


def test_rejected_configuration_is_reported_and_the_relay_keeps_its_own(env):
    running_static(env)
    env.cluster.configmap(NS, "cri-resmgr-config.default", {"policy": "Active: [static"})
    wait_for(lambda: env.node_status().get("applied") is False, what="the rejection annotation")
    assert "not valid YAML" in env.node_status()["error"]
    assert env.active() == "static"
    events = wait_for(env.cluster.events, what="an Event")
    event = events[0]
    assert event["reason"] == "ConfigRejected" and event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == env.node
    assert "not valid YAML" in event["message"]
    probe = subprocess.run([sys.executable, "-m", "resmgr.agent", "probe", "--agent-socket", env.agent.socket],
                           capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert probe.returncode == 1 and "rejected cri-resmgr-config.default" in probe.stderr
    wait_for(lambda: not env.agent.ready_file.exists(), timeout=15, what="the readiness file gone")  # chart probe

    env.cluster.configmap(NS, "cri-resmgr-config.default", {"policy.static": "RelaxedIsolation: sometimes\n"})
    wait_for(lambda: "RelaxedIsolation" in env.node_status().get("error", ""), what="a value error")
    assert env.active() == "static"
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("static-plus"))
    wait_for(lambda: env.node_status().get("applied") is True)
    probe = subprocess.run([sys.executable, "-m", "resmgr.agent", "probe", "--agent-socket", env.agent.socket],
                           capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert probe.returncode == 0, probe.stderr
    wait_for(env.agent.ready_file.exists, what="the agent's readiness file")


def test_the_agent_resumes_its_watches_after_an_api_server_restart(env):
    running_static(env)
    env.cluster.control.restart_apiserver()
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("static-plus"))
    wait_for(lambda: env.active() == "static-plus", timeout=30, what="a change after the restart")
    assert "retrying in" in env.agent.log()  # it saw the server go
    healthy_again(env)


def test_watches_survive_drops_and_expiry(fake_env):
    env = fake_env
    running_static(env)
    env.cluster.api.drop_watches()
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("static-plus"))
    wait_for(lambda: env.active() == "static-plus", what="a change after the watches dropped")

    # The API server restarts and its history is gone: resuming watches get 410 Gone, relist.
    env.cluster.api.stop()
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("topology-aware"))
    env.cluster.api.compact()
    time.sleep(0.3)
    env.cluster.api.start()
    wait_for(lambda: env.active() == "topology-aware", what="the change made while the server was down")
    assert "410 Gone" in env.agent.log()
    healthy_again(env)


def test_a_change_while_the_relay_is_down_is_pushed_when_it_returns(env):
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("static"))
    env.agent.start()
    wait_for(lambda: "not reachable" in env.agent.stub().HealthCheck(api_pb2.HealthCheckRequest(), timeout=5).error,
             what="the agent to notice")
    env.start_relay()
    wait_for(lambda: env.active() == "static", what="the push once the relay is up")
    env.relay.stop()
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("static-plus"))
    time.sleep(0.5)
    env.start_relay()  # a restart keeps the pushed configuration, then gets the newer one
    wait_for(lambda: env.active() == "static-plus", what="the change made while the relay was down")

    # A relay that comes back without the pushed configuration (its state gone) gets it again.
    env.relay.stop()
    env.start_relay(state="fresh-state")  # starts on built-in defaults (none)
    wait_for(lambda: env.active() == "static-plus", what="the periodic resync")
    wait_for(applied(env, "cri-resmgr-config.default"))
    recorded = env.node_status()
    time.sleep(2.5)  # resyncs with the same outcome write nothing to the cluster
    assert env.node_status() == recorded


def test_agent_service_cluster_operations(env):
    env.agent.start()
    stub = env.agent.stub()
    node = json.loads(stub.GetNode(api_pb2.GetNodeRequest(), timeout=10).node)
    assert node["metadata"]["name"] == env.node
    stub.PatchNode(api_pb2.PatchNodeRequest(patches=[
        api_pb2.JsonPatch(op="add", path="/metadata/labels/example.com~1pool", value='"fast"')]), timeout=10)
    assert env.cluster.node_object()["metadata"]["labels"]["example.com/pool"] == "fast"
    stub.UpdateNodeCapacity(api_pb2.UpdateNodeCapacityRequest(capacities={"example.com/widget": "4"}), timeout=10)
    assert env.cluster.node_object()["status"]["capacity"] == {"cpu": "2", "example.com/widget": "4"}
    with pytest.raises(grpc.RpcError) as info:
        stub.UpdateNodeCapacity(api_pb2.UpdateNodeCapacityRequest(capacities={"cpu": "64"}), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        stub.PatchNode(api_pb2.PatchNodeRequest(patches=[
            api_pb2.JsonPatch(op="remove", path="/metadata/labels/missing")]), timeout=10)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("static"))
    wait_for(lambda: stub.GetConfig(api_pb2.GetConfigRequest(), timeout=5).config.get("policy") == "Active: static\n")
    assert oct(os.stat(env.agent.socket).st_mode & 0o777) == "0o600"


def test_agent_needs_a_node_name(tmp_path):
    out = subprocess.run([sys.executable, "-m", "resmgr.agent"], capture_output=True, text=True, cwd=ROOT, timeout=30,
                         env={k: v for k, v in os.environ.items() if k != "NODE_NAME"})
    assert out.returncode == 2 and "NODE_NAME" in out.stderr
    out = subprocess.run([sys.executable, "-m", "resmgr.agent", "--kubeconfig", str(tmp_path / "missing")],
                         capture_output=True, text=True, cwd=ROOT, timeout=30, env={**os.environ, "NODE_NAME": "n"})
    assert out.returncode == 2 and "cannot load kubeconfig" in out.stderr


@pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs")
def test_configmap_change_re_pins_running_containers(env, containerd):
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("static"))
    env.start_relay(containerd.socket)
    env.agent.start()
    wait_for(lambda: env.active() == "static", what="the default map")
    via = Cri(env.relay.socket)
    pods = []
    try:
        g_cfg = pod_config(qos="guaranteed", logdir=str(env.workdir / "logs"))
        pods.append(via.run_pod(g_cfg))
        g = via.run_container(pods[-1], g_cfg, container_config(resources=resources(1000, True)))
        s_cfg = pod_config(qos="besteffort", logdir=str(env.workdir / "logs"))
        pods.append(via.run_pod(s_cfg))
        s = via.run_container(pods[-1], s_cfg, container_config(resources=resources(0, False)))
        mine = cgroup_cpus(g_cfg, g)
        assert len(mine) == 1 and cgroup_cpus(s_cfg, s) == ONLINE - mine
        # Reserving every CPU leaves none to run anything on: refused, nothing moves.
        env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map(
            "topology-aware", f"ReservedResources:\n  cpu: cpuset:{ONLINE}\n"))
        wait_for(lambda: env.node_status().get("applied") is False, what="the rejection")
        assert env.active() == "static" and "no CPUs left to share" in env.node_status()["error"]
        assert cgroup_cpus(g_cfg, g) == mine and cgroup_cpus(s_cfg, s) == ONLINE - mine
        # Reserving the shared CPU: the exclusive container keeps its CPU and the best-effort one runs
        # on the reserved CPU, as kubelet's shared pool would.
        env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map(
            "topology-aware", f"ReservedResources:\n  cpu: cpuset:{min(ONLINE - mine)}\n"))
        wait_for(lambda: env.active() == "topology-aware" and "cpuset:" in env.status().config, what="the switch")
        assert cgroup_cpus(g_cfg, g) == mine and cgroup_cpus(s_cfg, s) == ONLINE - mine
        # Without reserved CPUs: applied, and the cgroups are as the policy says.
        env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("topology-aware"))
        wait_for(lambda: "cpuset:" not in env.status().config and env.node_status().get("applied"),
                 what="the switch")
        mine = cgroup_cpus(g_cfg, g)
        assert len(mine) == 1 and cgroup_cpus(s_cfg, s) == ONLINE - mine
        assert cgroup_cpuset(g_cfg, g, "mems")  # topology-aware pins memory as well
    finally:
        for p in pods:
            via.remove_pod(p)
        via.close()


@pytest.mark.parametrize("older", ["agent", "daemon"])
def test_an_agent_and_a_daemon_one_release_apart_work_together(env, previous_release, older):
    """A rolling upgrade: for a while one of the two is the previous release. Pushes, changes and
    rejections go through and are recorded either way."""
    if older == "agent":
        env.agent.of_release(previous_release.python, previous_release.home)
    env.start_relay(release=previous_release if older == "daemon" else None)
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("static"))
    env.agent.start()
    wait_for(lambda: env.active() == "static", what="the first push")
    wait_for(applied(env, "cri-resmgr-config.default"), what="the outcome recorded")
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("static-plus"))
    wait_for(lambda: env.active() == "static-plus", what="a change")
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("nonesuch"))
    wait_for(lambda: "nonesuch" in env.node_status().get("error", ""), what="the rejection recorded")
    assert env.active() == "static-plus"
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("static"))
    wait_for(applied(env, "cri-resmgr-config.default"), what="the fix recorded")
    healthy_again(env)
