"""The node agent's test environment: a Kubernetes API server (the real one, or tests/support/kubeapi.py
for what a real one will not do on cue), a cri-resmgr, and a cri-resmgr-agent between them."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import yaml
from kubernetes import client, utils
from kubernetes.client.rest import ApiException

from harness import helm
from harness.kube import ControlPlane
from resmgr.agent import resources as rs
from resmgr.generated.agent import api_pb2, api_pb2_grpc
from resmgr.generated.config import status_pb2
from tests.support.helpers import ROOT, RelayProcess, resmgr_status, wait_socket
from tests.support.kubeapi import KubeAPI

NS = "kube-system"
LABEL = "cri-resource-manager.intel.com/group"
STATUS = "cri-resource-manager.intel.com/config-status"
CRDS = [helm.CHART / "crds" / f"{rs.PLURAL}.yaml", helm.CHART / "crds" / f"{rs.NODE_PLURAL}.yaml",
        helm.CHART / "files" / "noderesourcetopologies.yaml"]
AGENT_USER = "system:serviceaccount:kube-system:cri-resmgr-agent"


def wait_for(check: Callable[[], object], timeout: float = 15.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class AgentProcess:
    def __init__(self, workdir: Path, node: str, kubeconfig: str, relay_config_socket: str) -> None:
        self.node = node
        self.socket = str(workdir / "agent" / "agent.sock")
        self.log_path = workdir / f"agent-{uuid.uuid4().hex[:6]}.log"
        self.args = [sys.executable, "-m", "resmgr.agent", "--kubeconfig", kubeconfig, "--config-namespace", NS,
                     "--config-socket", relay_config_socket, "--agent-socket", self.socket,
                     "--debounce", "0.1", "--retry-max", "0.5", "--resync-interval", "1", "--log-level", "DEBUG"]
        self.ready_file = workdir / f"agent-{uuid.uuid4().hex[:6]}.ready"
        self.args += ["--ready-file", str(self.ready_file)]
        self.proc: subprocess.Popen | None = None
        self.cwd = ROOT

    def of_release(self, python: Path, home: Path) -> AgentProcess:
        """Run another build (a release's virtual environment) instead of this tree's."""
        self.args[0], self.cwd = str(python), home
        self.args = self.args[:-2]  # 0.1.0 has no --ready-file
        return self

    def start(self, *extra: str) -> AgentProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([*self.args, *extra], stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                         env={**os.environ, "NODE_NAME": self.node})
        wait_socket(self.socket, proc=self.proc)
        return self

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stub(self) -> api_pb2_grpc.AgentStub:
        return api_pb2_grpc.AgentStub(grpc.insecure_channel("unix://" + self.socket))


class TallyProcess:
    """`cri-resmgr-agent tally` with the chart's ServiceAccount for it."""

    def __init__(self, workdir: Path, kubeconfig: str) -> None:
        self.log_path = workdir / f"tally-{uuid.uuid4().hex[:6]}.log"
        self.ready_file = workdir / f"tally-{uuid.uuid4().hex[:6]}.ready"
        self.args = [sys.executable, "-m", "resmgr.agent", "tally", "--kubeconfig", kubeconfig,
                     "--config-namespace", NS, "--interval", "0.2", "--log-level", "DEBUG",
                     "--ready-file", str(self.ready_file)]
        self.proc: subprocess.Popen | None = None

    def start(self) -> TallyProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)


class RealCluster:
    """The objects the agent reads and writes, on the real API server (harness.kube), set up and read
    back with an admin client; the agent itself gets a token of the shipped ServiceAccount and RBAC."""

    def __init__(self, control: ControlPlane, node: str) -> None:
        self.control, self.node = control, node
        self.core = control.core()
        install_agent_rbac(control)
        install_crds(control)
        self.custom = client.CustomObjectsApi(control.api_client())
        labels = {"kubernetes.io/hostname": node, "kubernetes.io/os": "linux"}  # as a kubelet registers it
        self.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node, labels=labels),
                                            status=client.V1NodeStatus(capacity={"cpu": "2"})))
        self.maps: set[tuple[str, str]] = set()
        self.resources: set[str] = set()
        self.since = datetime.datetime.now(datetime.UTC)
        self.tally: TallyProcess | None = None

    def start_tally(self, workdir: Path) -> None:
        """One tally for the namespace, as the chart runs it (once per test: tests share the server)."""
        self.tally = TallyProcess(workdir, str(self.control.kubeconfig_for(NS, "cri-resmgr-tally"))).start()

    def kubeconfig(self, path: str) -> str:
        return str(self.control.kubeconfig_for(NS, "cri-resmgr-agent"))

    def configmap(self, namespace: str, name: str, data: dict[str, str]) -> None:
        body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data=data)
        if (namespace, name) in self.maps:
            self.core.replace_namespaced_config_map(name, namespace, body)
        else:
            self.core.create_namespaced_config_map(namespace, body)
            self.maps.add((namespace, name))

    def delete_configmap(self, namespace: str, name: str) -> None:
        self.core.delete_namespaced_config_map(name, namespace)
        self.maps.discard((namespace, name))

    def node_object(self) -> dict:
        return json.loads(self.core.read_node(self.node, _preload_content=False).data)

    def set_label(self, key: str, value: str | None) -> None:
        self.core.patch_node(self.node, {"metadata": {"labels": {key: value}}})

    def events(self) -> list[dict]:
        return json.loads(self.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={self.node}", _preload_content=False).data)["items"]

    # -- configuration resources (in NS) and the node's NodeResourceTopology --
    def resource(self, name: str, spec: dict) -> dict:
        """Create or replace a ResourceManagerConfig; its status is left as the agents wrote it."""
        args = (rs.GROUP, rs.VERSION, NS, rs.PLURAL)
        body = {"apiVersion": f"{rs.GROUP}/{rs.VERSION}", "kind": rs.KIND, "metadata": {"name": name}, "spec": spec}
        if name in self.resources:
            for attempt in range(5):  # the agents' status writes move the version on: read again, as kubectl does
                old = self.custom.get_namespaced_custom_object(*args, name)
                body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                try:
                    return self.custom.replace_namespaced_custom_object(*args, name, body)
                except ApiException as err:
                    if err.status != 409 or attempt == 4:
                        raise
                    time.sleep(0.1)
        self.resources.add(name)
        return self.custom.create_namespaced_custom_object(*args, body)

    def resource_object(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.PLURAL, name)

    def node_entry(self, name: str) -> dict:
        """This node's outcome for a resource, from its ResourceManagerNodeStatus ({} if it runs another)."""
        status = (self.node_status_object() or {}).get("status") or {}
        return status if (status.get("kind"), status.get("name")) == (rs.KIND, name) else {}

    def node_status_object(self) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.NODE_PLURAL, self.node)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def delete_resource(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.PLURAL, name)
        self.resources.discard(name)

    def resource_events(self, name: str) -> list[dict]:
        return json.loads(self.core.list_namespaced_event(
            NS, field_selector=f"involvedObject.name={name},involvedObject.kind={rs.KIND}",
            _preload_content=False).data)["items"]

    def topology(self) -> dict | None:
        return node_topology(self.custom, self.node)

    def close(self) -> None:
        if self.tally is not None:
            self.tally.stop()
        for namespace, name in list(self.maps):
            self.delete_configmap(namespace, name)
        for name in list(self.resources):
            self.delete_resource(name)
        if self.topology() is not None:
            self.custom.delete_cluster_custom_object(rs.NRT_GROUP, rs.NRT_VERSION, rs.NRT_PLURAL, self.node)
        if self.node_status_object() is not None:  # no garbage collector here to follow the owner
            self.custom.delete_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.NODE_PLURAL, self.node)
        self.core.delete_node(self.node)


def node_topology(custom: client.CustomObjectsApi, node: str) -> dict | None:
    """The node's NodeResourceTopology as the API server has it (None: there is none)."""
    try:
        return custom.get_cluster_custom_object(rs.NRT_GROUP, rs.NRT_VERSION, rs.NRT_PLURAL, node)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def install_agent_rbac(control: ControlPlane, dra: bool = False, extended_resource: str = "") -> None:
    """The chart's RBAC of the agent (exporting the topology; dra: publishing DRA devices too, and the
    chart's DeviceClass, answering extended_resource if given), as it installs it (once per server)."""
    values: dict[str, Any] = {"nodeResourceTopology.export": True, "dra.enabled": dra,
                              "dra.extendedResourceName": extended_resource}
    objects = helm.render(values, namespace=NS, only="templates/agent-rbac.yaml")
    if dra:
        objects += helm.render(values, namespace=NS, only="templates/dra-deviceclass.yaml")
    try:
        utils.create_from_yaml(control.api_client(), yaml_objects=objects)
    except utils.FailToCreateError as err:  # made by an earlier test
        if any(e.status != 409 for e in err.api_exceptions):
            raise


def install_crds(control: ControlPlane) -> None:
    """The chart's CRDs on the API server, established (once per server)."""
    ext = client.ApiextensionsV1Api(control.api_client())
    for path in CRDS:
        doc = yaml.safe_load(path.read_text())
        try:
            ext.create_custom_resource_definition(doc)
        except ApiException as err:
            if err.status != 409:
                raise
        name = doc["metadata"]["name"]

        def established(name: str = name) -> bool:
            conditions = (ext.read_custom_resource_definition(name).status.conditions or [])
            return any(c.type == "Established" and c.status == "True" for c in conditions)
        wait_for(established, 30, f"CRD {name} established")


class FakeCluster:
    """The same on tests/support/kubeapi.py, for what a real API server will not do on cue (drop every watch,
    forget its history)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.api = KubeAPI().start()
        self.api.node(node)

    def kubeconfig(self, path: str) -> str:
        return self.api.kubeconfig(path)

    def configmap(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.api.configmap(namespace, name, data)

    def delete_configmap(self, namespace: str, name: str) -> None:
        self.api.store.delete("configmaps", namespace, name)

    def node_object(self) -> dict:
        return self.api.get("nodes", self.node) or {}

    def set_label(self, key: str, value: str | None) -> None:
        node = self.node_object()
        labels = node["metadata"].setdefault("labels", {})
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
        self.api.store.put("nodes", node)

    def events(self) -> list[dict]:
        return self.api.events()

    def close(self) -> None:
        self.api.stop()


class Env:
    """An API server, a cri-resmgr (no runtime behind it unless given one) and an agent between them."""

    def __init__(self, workdir: Path, cluster: RealCluster | FakeCluster) -> None:
        self.workdir, self.cluster, self.node = workdir, cluster, cluster.node
        self.config_socket = str(workdir / "cfg" / "config.sock")
        self.relay: RelayProcess | None = None
        self.agent = AgentProcess(workdir, self.node, cluster.kubeconfig(str(workdir / "kubeconfig")),
                                  self.config_socket)

    def start_relay(self, runtime_socket: str | None = None, state: str = "state", *extra: str,
                    release: Any = None) -> None:
        """release: a harness.releases.Release to run instead of this tree."""
        runtime_socket = runtime_socket or str(self.workdir / "no-runtime.sock")
        self.relay = RelayProcess(self.workdir, runtime_socket, "--config-socket", self.config_socket, *extra,
                                  relay_dir=self.workdir / state)
        if release is not None:
            self.relay.of_release(release.python, release.home)
        self.relay.start()
        wait_socket(self.config_socket, proc=self.relay.proc)

    def status(self) -> status_pb2.GetStatusReply:
        return resmgr_status(self.config_socket, timeout=5)

    def active(self) -> str:
        return self.status().policy

    def node_status(self) -> dict:
        text = self.cluster.node_object().get("metadata", {}).get("annotations", {}).get(STATUS)
        return json.loads(text) if text else {}

    def label(self, group: str | None) -> None:
        self.cluster.set_label(LABEL, group)

    def close(self) -> None:
        if self.agent.proc is not None:
            self.agent.stop()
        if self.relay is not None:
            self.relay.stop()
        self.cluster.close()


def policy_map(policy: str, extra: str = "") -> dict[str, str]:
    return {"policy": f"Active: {policy}\n{extra}"}


def applied(env: Env, name: str) -> Callable[[], bool]:
    return lambda: env.node_status().get("configMap") == f"{NS}/{name}" and env.node_status().get("applied")


def running_static(env: Env) -> None:
    """cri-resmgr and the agent up, with the default ConfigMap's static policy applied."""
    env.start_relay()
    env.cluster.configmap(NS, "cri-resmgr-config.default", policy_map("static"))
    env.agent.start()
    wait_for(lambda: env.active() == "static")


def healthy_again(env: Env) -> None:
    wait_for(lambda: env.agent.stub().HealthCheck(api_pb2.HealthCheckRequest(), timeout=5).error == "",
             what="healthy again")


# -- a NodeResourceTopology next to `cri-resmgr status` --
def zones(nrt: dict) -> dict[str, dict]:
    return {z["name"]: z for z in nrt["zones"]}


def attrs(zone: dict) -> dict[str, str]:
    return {a["name"]: a["value"] for a in zone.get("attributes", [])}


def cpu(zone: dict) -> dict[str, str]:
    return next(r for r in zone["resources"] if r["name"] == "cpu")


def status_doc(config_socket: str) -> dict:
    """The state document `cri-resmgr status --output json` prints."""
    out = subprocess.run([sys.executable, "-m", "resmgr", "status", "--config-socket", config_socket,
                          "--output", "json"], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr or out.stdout[-2000:]}"
    return json.loads(out.stdout)["state"]


def matches_status(nrt: dict, state: dict) -> bool:
    """The NodeResourceTopology says what `cri-resmgr status` says: the same pools with the same CPUs,
    grants and free shared CPU, and one Node zone per NUMA node with its CPUs."""
    z = zones(nrt)
    for pool in state["pools"]:
        zone, st = z.get(pool["name"]), pool["stats"]
        if zone is None or attrs(zone)["cpus"] != (pool["cpus"] or "-"):
            return False
        if (attrs(zone)["exclusive-grants"], attrs(zone)["containers"]) != (str(st["exclusive_grants"]),
                                                                           str(st["containers"])):
            return False
        free = st["shared_milli_free"]
        if cpu(zone)["available"] != (str(free // 1000) if free % 1000 == 0 else f"{free}m"):
            return False
    nodes = {f"node-{n['id']}": n for n in state["topology"]["nodes"]}
    return {n for n, zone in z.items() if zone["type"] == "Node"} == set(nodes) and \
        {a["name"]: a["value"] for a in nrt["attributes"]}["policy"] == state["policy"]


def milli(q: str) -> int:
    return int(q[:-1]) if q.endswith("m") else int(q) * 1000
