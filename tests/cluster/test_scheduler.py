"""The topology-aware scheduler plugin reading what our agent publishes: NodeResourceTopologyMatch of
kubernetes-sigs/scheduler-plugins runs as a second scheduler beside kube-scheduler, over two nodes,
each a kubelet on cri-resmgr (relay, topology-aware) whose agent exports the node's
NodeResourceTopology.

Both nodes have this machine's CPUs 0 and 1, and kubelet counts the same allocatable CPUs on both;
only their topology differs, as each cri-resmgr reads it from a generated sysfs: one NUMA node of
two CPUs ("wide") and two NUMA nodes of one CPU each ("split"). A Guaranteed pod of two CPUs fits
the split node by kubelet's count but cannot be aligned there, so the plugin must send it to the
wide node; with the wide node full it must wait rather than go to the split one."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kubernetes import client

from harness.kube import TOPOLOGY_SCHEDULER, ControlPlane, Process, pod_manifest, start_topology_scheduler
from resmgr.agent import resources as rs
from resmgr.topology.cpuset import CPUSet
from resmgr.topology.generate import generate, parse_spec
from tests.support.agentenv import (
    NS,
    AgentProcess,
    attrs,
    cpu,
    install_agent_rbac,
    install_crds,
    matches_status,
    node_topology,
    status_doc,
    wait_for,
    zones,
)
from tests.support.helpers import ONLINE
from tests.support.kubenode import NAMESPACE, KubeNode, done_with, scratch

pytestmark = [pytest.mark.skipif(not CPUSet.parse("0-1") <= ONLINE, reason="the generated CPUs must exist here"),
              pytest.mark.timeout(600)]

WIDE, SPLIT = "crirm-wide", "crirm-split"
MACHINES = {WIDE: "nodes=1,cores=2,threads=1", SPLIT: "nodes=2,cores=1,threads=1"}
# No reserved CPUs (the pod takes both); memory not pinned: the split machine's node 1 is not this one's.
CONFIG = {"policy": {"Active": "topology-aware", "topology-aware": {"PinMemory": False}}}


class Cluster:
    def __init__(self) -> None:
        self.control = ControlPlane(controllers=True).start()
        self.core = self.control.core()
        self.custom = client.CustomObjectsApi(self.control.api_client())
        self.nodes: dict[str, KubeNode] = {}
        self.agents: list[AgentProcess] = []
        self.scheduler: Process | None = None

    def start(self) -> Cluster:
        install_agent_rbac(self.control)
        install_crds(self.control)
        self.custom.create_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.PLURAL, {
            "apiVersion": f"{rs.GROUP}/{rs.VERSION}", "kind": rs.KIND, "metadata": {"name": "default"},
            "spec": CONFIG})
        kubeconfig = str(self.control.kubeconfig_for(NS, "cri-resmgr-agent"))
        for name, machine in MACHINES.items():
            work = scratch()
            root = generate(parse_spec(machine), work / "host")
            fallback = work / "fallback.yaml"
            fallback.write_text(yaml.safe_dump(CONFIG))
            self.nodes[name] = KubeNode(self.control, work, policy="", node=name, relay_args=(
                "--host-root", str(root), "--cgroup-root", "/sys/fs/cgroup", "--fallback-config", str(fallback),
                "--metrics-address", f"unix:{work / 'view.sock'}"))  # the state `cri-resmgr status` prints
            self.nodes[name].start()
            self.agents.append(AgentProcess(work, name, kubeconfig, self.config_socket(name)).start(
                "--export-topology", "on", "--topology-interval", "0.2"))
        self.scheduler = start_topology_scheduler(self.control)
        return self

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
            assert self.scheduler is not None
            self.scheduler.check()

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
        for agent in self.agents:
            agent.stop()
        for node in self.nodes.values():
            node.stop()
            done_with(node.workdir)
        self.control.stop()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        yield c.start()
    finally:
        c.stop()


def node_zone_cpu(nrt: dict[str, Any], zone: str) -> str:
    return cpu(zones(nrt)[zone])["available"]


def test_a_guaranteed_pod_goes_to_the_node_that_can_align_it(cluster: Cluster) -> None:
    # What the plugin judges by: each node's object says what its cri-resmgr says, and that the
    # node aligns a container to one NUMA node.
    for node in MACHINES:
        nrt = wait_for(lambda node=node: cluster.agreed(node), 60, f"{node}'s NodeResourceTopology")
        assert attrs(nrt)["topologyManagerPolicy"] == "single-numa-node"
        assert attrs(nrt)["topologyManagerScope"] == "container"
    split = cluster.topology(SPLIT)
    assert (node_zone_cpu(split, "node-0"), node_zone_cpu(split, "node-1")) == ("1", "1")
    assert node_zone_cpu(cluster.topology(WIDE), "node-0") == "2"

    cluster.submit("aligned", "2")
    pod = cluster.placed("aligned", WIDE)
    assert pod.spec.node_name == WIDE
    assert cluster.nodes[WIDE].cpus("aligned") == {"c0": CPUSet.parse("0-1")}
    # The plugin turned the split node down, not a count of CPUs (kubelet's are the same on both).
    assert any('"cannot align container" pod="default/aligned"' in line and f'node="{SPLIT}"' in line
               for line in cluster.scheduler.log().splitlines())
    nrt = wait_for(lambda: (t := cluster.agreed(WIDE)) and node_zone_cpu(t, "node-0") == "0" and t, 30,
                   "the wide node's CPUs taken in its NodeResourceTopology")

    # Another such pod: the wide node has no CPU left and the split one cannot align it, so it waits.
    cluster.submit("waiting", "2")
    message = wait_for(lambda: cluster.unschedulable("waiting"), 60, "the pod found unschedulable")
    assert "cannot align" in message, message
    assert cluster.core.read_namespaced_pod("waiting", NAMESPACE).spec.node_name is None

    # The first pod gone, the object that says so lets the scheduler place the second on the wide node.
    cluster.nodes[WIDE].delete("aligned", 60)
    pod = cluster.placed("waiting", WIDE, 120)
    assert pod.spec.node_name == WIDE
    cluster.nodes[WIDE].delete("waiting", 60)

