"""Two kubelet nodes on cri-resmgr (relay, topology-aware) on one control plane with kube-scheduler,
each with its agent exporting the node's NodeResourceTopology and ResourceSlice, for the scheduler
and DRA tests (tests/cluster/test_scheduler.py, tests/cluster/test_dra_gated.py).

Both nodes have this machine's CPUs 0 and 1; only their topology differs, as each cri-resmgr reads
it from a generated sysfs: one NUMA node of two CPUs ("wide") and two NUMA nodes of one CPU each
("split")."""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from harness.kube import TOPOLOGY_SCHEDULER, ControlPlane, Process, pod_manifest, start_topology_scheduler
from resmgr.agent import resources as rs
from resmgr.topology.generate import generate, parse_spec
from tests.support.agentenv import (
    NS,
    AgentProcess,
    install_agent_rbac,
    install_crds,
    matches_status,
    node_topology,
    status_doc,
    wait_for,
)
from tests.support.kubenode import NAMESPACE, KubeNode, done_with, scratch

WIDE, SPLIT = "crirm-wide", "crirm-split"
NIC = "nic.test.cri-resource-manager.intel.com"  # the second driver's (tests/support/dradriver.py)
MACHINES = {WIDE: "nodes=1,cores=2,threads=1", SPLIT: "nodes=2,cores=1,threads=1"}
# No reserved CPUs (the pod takes both); memory not pinned: the split machine's node 1 is not this one's.
CONFIG = {"policy": {"Active": "topology-aware", "topology-aware": {"PinMemory": False}}}
DRIVER = "cpu.cri-resource-manager.intel.com"
EXTENDED = f"{DRIVER}/device"  # the extended resource the chart's DeviceClass answers here


class Cluster:
    def __init__(self, machines: dict[str, str] = MACHINES, gates: dict[str, bool] | None = None,
                 agent_args: tuple[str, ...] = (), front: str = "relay") -> None:
        """gates: feature gates of every component; agent_args: more options of each node's agent;
        front: cri-resmgr as the relay or as containerd's NRI plugin."""
        self.machines, self.gates, self.agent_args, self.front = machines, gates or {}, agent_args, front
        self.control = ControlPlane(controllers=True, gates=",".join(
            f"{k}={str(v).lower()}" for k, v in self.gates.items())).start()
        self.core = self.control.core()
        self.custom = client.CustomObjectsApi(self.control.api_client())
        self.nodes: dict[str, KubeNode] = {}
        self.roots: dict[str, Path] = {}  # each node's generated sysfs (cri-resmgr's --host-root)
        self.agents: list[AgentProcess] = []
        self.scheduler: Process | None = None

    def start(self) -> Cluster:
        install_agent_rbac(self.control, dra=True, extended_resource=EXTENDED)
        install_crds(self.control)
        self.custom.create_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.PLURAL, {
            "apiVersion": f"{rs.GROUP}/{rs.VERSION}", "kind": rs.KIND, "metadata": {"name": "default"},
            "spec": CONFIG})
        kubeconfig = str(self.control.kubeconfig_for(NS, "cri-resmgr-agent"))
        for name, machine in self.machines.items():
            work = scratch()
            root = generate(parse_spec(machine), work / "host")
            self.roots[name] = root
            fallback = work / "fallback.yaml"
            fallback.write_text(yaml.safe_dump(CONFIG))
            agent = AgentProcess(work, name, kubeconfig, str(work / "config.sock"))
            self.nodes[name] = KubeNode(self.control, work, front=self.front, policy="", node=name, relay_args=(
                "--host-root", str(root), "--cgroup-root", "/sys/fs/cgroup", "--fallback-config", str(fallback),
                *self.node_args(work, agent)), **({"featureGates": self.gates} if self.gates else {}))
            self.nodes[name].start()
            self.agents.append(agent.start("--export-topology", "on", "--export-devices", "on",
                                           "--topology-interval", "0.2", *self.agent_args))
        if not self.gates:
            self.scheduler = start_topology_scheduler(self.control)
        return self

    @staticmethod
    def node_args(work: Any, agent: AgentProcess) -> tuple[str, ...]:
        """cri-resmgr serving the state `cri-resmgr status` prints, and as the DRA driver of the node's
        kubelet, its CDI specs where its containerd reads them."""
        return ("--metrics-address", f"unix:{work / 'view.sock'}",
                "--dra-driver", DRIVER, "--kubelet-dir", str(work / "kubelet" / "root"),
                "--cdi-dir", str(work / "ctrd" / "cdi"), "--agent-socket", agent.socket)

    def config_socket(self, node: str) -> str:
        return str(self.nodes[node].workdir / "config.sock")

    def topology(self, node: str) -> dict[str, Any] | None:
        return node_topology(self.custom, node)

    def agreed(self, node: str) -> dict[str, Any] | None:
        """The node's NodeResourceTopology once it says what its cri-resmgr says."""
        nrt = self.topology(node)
        return nrt if nrt and matches_status(nrt, status_doc(self.config_socket(node))) else None

    def submit(self, name: str, cpus: str) -> None:
        """A Guaranteed pod for the second scheduler, on no node yet."""
        manifest = pod_manifest(name, "", cpu=cpus, memory="64Mi", limits=True)
        del manifest["spec"]["nodeName"]
        manifest["spec"]["schedulerName"] = TOPOLOGY_SCHEDULER
        self.core.create_namespaced_pod(NAMESPACE, manifest)

    def unschedulable(self, name: str) -> str:
        """The message of the scheduler's FailedScheduling Event for the pod ("" if none yet)."""
        events = self.core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items
        return next((e.message for e in events if e.reason == "FailedScheduling"), "")

    def placed(self, name: str, node: str, timeout: float = 90) -> Any:
        """The pod once it runs on the node (the scheduler still running)."""
        try:
            return self.nodes[node].wait_running(name, timeout)
        finally:
            if self.scheduler is not None:
                self.scheduler.check()

    @contextlib.contextmanager
    def own_policy(self, node: str, policy: dict[str, Any]) -> Iterator[None]:
        """The node's own ResourceManagerConfig (node.<node>) with this policy section while the block
        runs; the default's again after it."""
        self.custom.create_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.PLURAL, {
            "apiVersion": f"{rs.GROUP}/{rs.VERSION}", "kind": rs.KIND, "metadata": {"name": f"node.{node}"},
            "spec": {"policy": policy}})
        try:
            yield
        finally:
            self.custom.delete_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.PLURAL, f"node.{node}")

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
        for agent in self.agents:
            agent.stop()
        for node in self.nodes.values():
            node.stop()
            done_with(node.workdir)
        self.control.stop()



CLAIMS = ("resource.k8s.io", "v1", NAMESPACE, "resourceclaims")


def make_claim(cluster: Cluster, name: str, cpus: str = "", kind: str = "numa", numa: int | None = None,
               where: str = "") -> None:
    """A claim for CPUs of one device of the kind (cpus "": as many as the device has), on NUMA node
    numa by the standard attribute other drivers' devices carry too (None: any); where: a condition
    on one more of our attributes (`cpuID == 1`)."""
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "selectors": [
        {"cel": {"expression": f'device.attributes["{DRIVER}"].kind == "{kind}"'}}]}
    if where:
        exactly["selectors"].append({"cel": {"expression": f'device.attributes["{DRIVER}"].{where}'}})
    if numa is not None:
        exactly["selectors"].append(
            {"cel": {"expression": f'device.attributes["resource.kubernetes.io"].numaNode == {numa}'}})
    if cpus:
        exactly["capacity"] = {"requests": {"cpu": cpus}}
    cluster.custom.create_namespaced_custom_object(*CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "cpus", "exactly": exactly}]}}})


def submit_claiming(cluster: Cluster, name: str, *claims: str, node: str = "") -> None:
    """A best-effort pod for kube-scheduler whose one container takes its CPUs from the claims."""
    manifest = pod_manifest(name, "")
    del manifest["spec"]["nodeName"]
    if node:
        manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    manifest["spec"]["resourceClaims"] = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    manifest["spec"]["containers"][0].setdefault("resources", {})["claims"] = [
        {"name": f"c{i}"} for i in range(len(claims))]
    cluster.core.create_namespaced_pod(NAMESPACE, manifest)


# -- a second driver's devices (tests/support/dradriver.py) -------------------------------------------
def nic_class(cluster: Cluster) -> None:
    """The DeviceClass of the test driver's NICs."""
    cluster.custom.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": NIC},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{NIC}"'}}]}})


def nic_driver(cluster: Cluster, node: str, **devices: int) -> Process:
    """The test DRA driver on the node's kubelet, publishing NICs on the given NUMA nodes."""
    work = cluster.nodes[node].workdir
    proc = Process(f"nic-driver-{node}", [
        sys.executable, "-m", "tests.support.dradriver", "--driver", NIC, "--node", node,
        "--kubelet-dir", str(work / "kubelet" / "root"), "--kubeconfig", str(cluster.control.admin_kubeconfig),
        *(f"--device={name}={numa}" for name, numa in devices.items())],
        work / f"nic-driver-{uuid.uuid4().hex[:6]}.log")
    proc.start()
    wait_for(lambda: "published" in proc.log(), 60, f"the NIC driver registered with {node}'s kubelet")
    return proc


def make_aligned_claim(cluster: Cluster, name: str, cpus: str) -> None:
    """CPUs of one NUMA node and a NIC, both on the same NUMA node by the standard attribute."""
    numa = {"cel": {"expression": f'device.attributes["{DRIVER}"].kind == "numa"'}}
    cluster.custom.create_namespaced_custom_object(*CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {
            "requests": [
                {"name": "cpus", "exactly": {"deviceClassName": DRIVER, "capacity": {"requests": {"cpu": cpus}},
                                             "selectors": [numa]}},
                {"name": "nic", "exactly": {"deviceClassName": NIC}}],
            "constraints": [{"matchAttribute": "resource.kubernetes.io/numaNode"}]}}})


def allocated(cluster: Cluster, claim: str) -> dict[str, str]:
    """The claim's devices: request name -> device name."""
    doc = cluster.custom.get_namespaced_custom_object(*CLAIMS, claim)
    return {r["request"]: r["device"] for r in doc["status"]["allocation"]["devices"]["results"]}
