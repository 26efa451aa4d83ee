"""`helm install` on a cluster that runs pods: a control plane with its controller manager and
scheduler, a kubelet on a real containerd with NRI, and the project's image. The chart's pods do
the work: the NRI DaemonSet's plugin places pods the scheduler puts on the node, the agent
DaemonSet pushes the chart's configuration and reports it, the webhook's replicas annotate pods.

The one difference from a production cluster: there is no kube-proxy here and the API server
listens on loopback only, so the agent uses the host's network and is told the API server's
address (agent.hostNetwork, agent.env), as on clusters whose pods cannot reach the "kubernetes"
Service."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness import helm, productimage
from harness.kube import ControlPlane, container_ids, describe, pod_manifest
from resmgr.agent import resources as rs
from resmgr.requests import RESOURCES_ANNOTATION
from resmgr.topology.cpuset import CPUSet
from tests.support.helpers import ONLINE, cgroup_cpus, container_cgroup
from tests.support.kubenode import KubeNode, done_with, scratch

pytestmark = [pytest.mark.skipif(len(ONLINE) < 2, reason="needs at least 2 CPUs"), pytest.mark.timeout(900)]

NS = "kube-system"
NODE = "crirm-helm"
LABEL = "cri-resource-manager.intel.com/node"
DRIVER = "cpu.cri-resource-manager.intel.com"
EXTENDED = f"{DRIVER}/device"  # the DeviceClass's extended resource


class Cluster:
    def __init__(self) -> None:
        self.control = ControlPlane(controllers=True).start()
        self.node = KubeNode(self.control, scratch(), front="direct", node=NODE)
        self.node.start()
        self.core = self.control.core()
        self.apps = client.AppsV1Api(self.control.api_client())
        self.custom = client.CustomObjectsApi(self.control.api_client())
        started = time.monotonic()
        archive = productimage.build()
        self.image = productimage.load(archive, self.node.ctrd.socket)
        self.image_seconds = time.monotonic() - started
        self.image_mb = archive.stat().st_size / 1e6
        self.core.patch_node(NODE, {"metadata": {"labels": {LABEL: "true"}}})
        work = self.node.workdir
        self.state_dir = work / "state"
        self.values: dict[str, Any] = {
            "mode": "nri", "webhook.enabled": True, "webhook.replicas": 2,
            "image.tag": productimage.builder().version(),
            "nri.socket": str(self.node.ctrd.dir / "nri.sock"), "nri.stateDir": str(self.state_dir),
            "nri.hookDir": str(work / "hooks"), "socketDir": str(work / "sockets"),
            "config": {"policy": {"Active": "static", "ReservedResources": {"cpu": "cpuset:0"}}},
            "agent.hostNetwork": True,
            # The DRA driver, on this kubelet's directory and this containerd's CDI directory.
            "dra.enabled": True, "dra.kubeletDir": str(self.node.kubelet.root),
            "dra.cdiDir": str(self.node.ctrd.cdi_dir), "agentSocketDir": str(work / "agent"),
            "dra.extendedResourceName": EXTENDED,
            "agent.env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                          {"name": "KUBERNETES_SERVICE_PORT", "value": str(self.control.port)}],
        }

    def helm(self, *args: str) -> str:
        out = helm.helm("--kubeconfig", str(self.control.admin_kubeconfig), *args)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def install(self, **values: Any) -> None:
        self.helm("upgrade", "--install", "cri-resmgr", str(helm.CHART), "--namespace", NS,
                  *helm._sets({**self.values, **values}))

    def pods(self, app: str) -> list[Any]:
        return self.core.list_namespaced_pod(NS, label_selector=f"app={app}").items

    def ready(self, app: str, count: int = 1, timeout: float = 180) -> list[Any]:
        """The app's pods once count of them run and are Ready."""
        deadline = time.monotonic() + timeout
        while True:
            pods = [p for p in self.pods(app) if p.metadata.deletion_timestamp is None]
            ok = [p for p in pods if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
            if len(ok) >= count:
                return ok
            if time.monotonic() > deadline:
                raise AssertionError(f"{app}: {len(ok)} of {count} pods Ready after {timeout}s: "
                                     + "; ".join(describe(p) for p in pods) + "\n" + self.logs(app))
            time.sleep(1)

    def logs(self, app: str) -> str:
        out = []
        for p in self.pods(app):
            try:
                out.append(self.core.read_namespaced_pod_log(p.metadata.name, NS, tail_lines=30))
            except client.ApiException as err:
                out.append(f"{p.metadata.name}: no log ({err.status})")
        return "\n".join(out)

    def restarts(self, pod: Any) -> str:
        """Why a pod's containers restarted: each one's last termination and the log it left."""
        out = [describe(pod)]
        for s in pod.status.container_statuses or []:
            out.append(f"{s.name}: restarted {s.restart_count}, last {s.last_state}")
            try:
                out.append(self.core.read_namespaced_pod_log(pod.metadata.name, NS, container=s.name,
                                                             previous=True, tail_lines=60))
            except client.ApiException as err:
                out.append(f"no previous log ({err.status})")
        return "\n".join(out)

    def run(self, name: str, cpu: str, guaranteed: bool, namespace: str = "default", claim: str = "") -> Any:
        """A pod the scheduler places (no node named), running; with claim, its CPUs come from that
        ResourceClaim alone."""
        manifest = pod_manifest(name, "", cpu, "32Mi" if cpu else "", limits=guaranteed)
        del manifest["spec"]["nodeName"]
        if claim:
            manifest["spec"]["resourceClaims"] = [{"name": "cpus", "resourceClaimName": claim}]
            manifest["spec"]["containers"][0]["resources"] = {"claims": [{"name": "cpus"}]}
        self.core.create_namespaced_pod(namespace, manifest)
        deadline = time.monotonic() + 120
        while not container_ids(pod := self.core.read_namespaced_pod(name, namespace)):
            assert time.monotonic() < deadline, (describe(pod), self.logs("cri-resmgr-nri"))
            time.sleep(0.5)
        return pod

    def claim(self, name: str, cpus: str) -> None:
        self.custom.create_namespaced_custom_object("resource.k8s.io", "v1", "default", "resourceclaims", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "cpus", "exactly": {
                "deviceClassName": DRIVER, "capacity": {"requests": {"cpu": cpus}}}}]}}})

    def devices(self) -> dict[str, str]:
        """This node's CPU devices in the published ResourceSlices: name -> cpu capacity."""
        slices = self.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
        return {d["name"]: d["capacity"]["cpu"]["value"] for s in slices if s["spec"]["driver"] == DRIVER
                and s["spec"].get("nodeName") == NODE for d in s["spec"].get("devices", [])}

    def cpus(self, pod: Any) -> CPUSet:
        assert self.node.direct is not None
        return cgroup_cpus(*container_cgroup(self.node.direct, container_ids(pod)["c0"]))

    def stop(self) -> None:
        try:
            self.helm("uninstall", "cri-resmgr", "--namespace", NS, "--wait", "--timeout", "120s")
        except AssertionError:
            pass
        self.node.stop()
        self.control.stop()
        done_with(self.node.workdir)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    c.stop()


def test_helm_install_in_nri_mode_runs_the_plugin_the_agent_and_the_webhook(cluster):
    c = cluster
    early = c.run("early", "1", guaranteed=True)  # running before the plugin: adopted at Synchronize
    started = time.monotonic()
    c.install()
    plugin = c.ready("cri-resmgr-nri")[0]
    assert restarts(plugin) == 0, c.restarts(plugin)  # its create made once, within kubelet's timeout
    agent = c.ready("cri-resmgr-agent")[0]
    hooks = c.ready("cri-resmgr-webhook", 2)
    c.ready("cri-resmgr-tally")
    ready_seconds = time.monotonic() - started
    print(f"image {c.image}: {c.image_mb:.0f} MB, built and loaded in {c.image_seconds:.0f} s; "
          f"every pod Ready {ready_seconds:.0f} s after helm install")
    assert plugin.spec.node_name == agent.spec.node_name == NODE  # placed by the DaemonSet controller and scheduler
    assert {p.spec.node_name for p in hooks} == {NODE}

    # The agent pushed the chart's configuration and says so in its node's status; the tally counts it
    # in the resource's.
    deadline = time.monotonic() + 60
    while ((status := (c.custom.get_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.PLURAL, "default")
                       .get("status") or {})).get("success"), status.get("failure")) != (1, 0):
        assert time.monotonic() < deadline, (status, c.logs("cri-resmgr-agent"), c.logs("cri-resmgr-tally"))
        time.sleep(1)
    mine = c.custom.get_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.NODE_PLURAL, NODE)["status"]
    assert (mine["kind"], mine["name"], mine["status"]) == (rs.KIND, "default", rs.SUCCESS)
    # With the agent pod's own token: its node's objects, and no other node's.
    assert asyncio.run(agent_writes(c, agent, NODE)) == ""
    assert "may write only that node's objects, not other-node" in asyncio.run(agent_writes(c, agent, "other-node"))
    assert asyncio.run(slice_writes(c, agent, NODE)) == ""
    assert "may write only that node's objects" in asyncio.run(slice_writes(c, agent, "other-node"))

    # The plugin registered with containerd and holds the pod that ran before it, under the pushed policy.
    deadline = time.monotonic() + 30
    while active_policy(c) != "static":  # written as the switch is, with or just after the answer
        assert time.monotonic() < deadline, active_policy(c)
        time.sleep(0.5)
    state = json.loads((c.state_dir / "cache").read_text())
    assert early.metadata.uid in {p["uid"] for p in state["pods"]}
    c.core.delete_namespaced_pod("early", "default", grace_period_seconds=0)  # the node has 2 CPUs
    wait_gone_pods(c, "default", 120)  # its exclusive CPU given back before the next pod asks for one

    # A Guaranteed pod the scheduler places gets an exclusive CPU outside the reserved one; the
    # webhook's annotation says what it asked for.
    g = c.run("placed", "1", guaranteed=True)
    assert g.spec.node_name == NODE
    assert RESOURCES_ANNOTATION in (g.metadata.annotations or {}), g.metadata.annotations
    mine = c.cpus(g)
    assert len(mine) == 1 and 0 not in mine, mine
    b = c.run("shared", "100m", guaranteed=False)
    assert not c.cpus(b) & mine

    for name in ("placed", "shared"):
        c.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    wait_gone_pods(c, "default")


async def agent_writes(c: Cluster, pod: Any, node: str) -> str:
    """Apply a ResourceManagerNodeStatus for node with the token kubelet gave the agent's pod: ""
    when the API server takes it, its refusal otherwise."""
    from resmgr.agent.apiclient import ApiError, Client, Credentials
    from resmgr.agent.kube import Cluster as Writes

    (token,) = (c.node.kubelet.root / "pods" / pod.metadata.uid / "volumes").glob("kubernetes.io~projected/*/token")
    api = Client(Credentials(server=c.control.server, ca_file=str(c.control.pki.ca), token=token.read_text()))
    status = {"kind": rs.KIND, "name": "default", "generation": 1, "status": rs.SUCCESS,
              "timestamp": "2026-01-01T00:00:00Z"}
    try:
        owner = {"metadata": {"uid": c.core.read_node(NODE).metadata.uid}} if node == NODE else None
        await Writes(api, node).put_node_status(NS, status, owner)
        return ""
    except ApiError as err:
        return f"{err.status} {err.body}"
    finally:
        await api.close()


async def slice_writes(c: Cluster, pod: Any, node: str) -> str:
    """Apply an empty ResourceSlice of node with the agent pod's token: "" or the refusal."""
    from resmgr.agent.apiclient import ApiError, Client, Credentials
    from resmgr.agent.kube import Cluster as Writes

    (token,) = (c.node.kubelet.root / "pods" / pod.metadata.uid / "volumes").glob("kubernetes.io~projected/*/token")
    api = Client(Credentials(server=c.control.server, ca_file=str(c.control.pki.ca), token=token.read_text()))
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-probe"},
            "spec": {"driver": "probe.example.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": []}}
    try:
        await Writes(api, node).put_slice(body)
        return ""
    except ApiError as err:
        return f"{err.status} {err.body}"
    finally:
        await api.close()


def plugin_pod(c: Cluster) -> Any:
    return c.ready("cri-resmgr-nri")[0]


def restarts(pod: Any) -> int:
    return sum(s.restart_count for s in pod.status.container_statuses or [])


def active_policy(c: Cluster) -> str:
    return json.loads((c.state_dir / "cache").read_text())["policy"]["name"]


def test_helm_upgrade_switches_the_policy_live_without_restarting_pods(cluster):
    c = cluster
    c.install()
    before = plugin_pod(c)
    g = c.run("kept-through-upgrade", "1", guaranteed=True)
    held = c.cpus(g)
    assert active_policy(c) == "static" and len(held) == 1
    c.install(config={"policy": {"Active": "topology-aware", "ReservedResources": {"cpu": "cpuset:0"}}})
    deadline = time.monotonic() + 90
    while active_policy(c) != "topology-aware":
        assert time.monotonic() < deadline, c.logs("cri-resmgr-agent")
        time.sleep(1)
    after = plugin_pod(c)
    assert after.metadata.uid == before.metadata.uid  # the same pod, not a new one
    # Not restarted by the switch. (A loaded machine may have restarted it at install: containerd's
    # native snapshotter copies the image for each create, which can outlast kubelet's 2-minute
    # runtime request timeout; kubelet then makes the container anew.)
    assert restarts(after) == restarts(before), c.restarts(after)
    pod = c.core.read_namespaced_pod("kept-through-upgrade", "default")
    assert container_ids(pod) == container_ids(g) and len(c.cpus(pod)) == 1


def test_a_claim_through_the_installed_dra_driver(cluster):
    # The plugin pod is kubelet's DRA driver: its NUMA node is in the slice the agent pod publishes, a
    # claimed pod runs on the claim's CPU, and the claim's CDI spec is where containerd reads it.
    c = cluster
    c.core.delete_namespaced_pod("kept-through-upgrade", "default", grace_period_seconds=0)
    wait_gone_pods(c, "default")
    deadline = time.monotonic() + 90
    while c.devices() != {"numa-0": "1"}:
        assert time.monotonic() < deadline, (c.devices(), c.logs("cri-resmgr-agent"), c.logs("cri-resmgr-nri"))
        time.sleep(1)
    c.claim("one-cpu", "1")
    pod = c.run("claimed", "", guaranteed=False, claim="one-cpu")
    assert c.cpus(pod) == CPUSet.parse("1")
    assert [p.name for p in c.node.ctrd.cdi_dir.iterdir()] != []
    c.core.delete_namespaced_pod("claimed", "default", grace_period_seconds=0)
    wait_gone_pods(c, "default")
    c.custom.delete_namespaced_custom_object("resource.k8s.io", "v1", "default", "resourceclaims", "one-cpu")
    deadline = time.monotonic() + 60
    while list(c.node.ctrd.cdi_dir.iterdir()):  # unprepared: its spec goes
        assert time.monotonic() < deadline, c.logs("cri-resmgr-nri")
        time.sleep(0.5)

    # The chart's DeviceClass names an extended resource: a pod asking for it gets the CPU with no
    # claim of its own (the scheduler makes one).
    manifest = pod_manifest("extended", "")
    del manifest["spec"]["nodeName"]
    manifest["spec"]["containers"][0]["resources"] = {"limits": {EXTENDED: "1"}}
    c.core.create_namespaced_pod("default", manifest)
    deadline = time.monotonic() + 120
    while not container_ids(pod := c.core.read_namespaced_pod("extended", "default")):
        assert time.monotonic() < deadline, (describe(pod), c.logs("cri-resmgr-nri"))
        time.sleep(0.5)
    assert not pod.spec.resource_claims and c.cpus(pod) == CPUSet.parse("1")
    c.core.delete_namespaced_pod("extended", "default", grace_period_seconds=0)
    wait_gone_pods(c, "default")


def test_a_killed_plugin_pod_comes_back_and_keeps_every_placement(cluster):
    c = cluster
    wait_gone_pods(c, "default")
    c.install()  # back to static: on 2 CPUs topology-aware has no room for shared and exclusive pods at once
    deadline = time.monotonic() + 90
    while active_policy(c) != "static":
        assert time.monotonic() < deadline, c.logs("cri-resmgr-agent")
        time.sleep(1)
    old = plugin_pod(c)
    b = c.run("shared-through-kill", "100m", guaranteed=False)
    g = c.run("exclusive-through-kill", "1", guaranteed=True)
    deadline = time.monotonic() + 30
    while (held := c.cpus(g)) & (shared := c.cpus(b)):
        assert time.monotonic() < deadline, (held, shared)
        time.sleep(0.5)
    c.core.delete_namespaced_pod(old.metadata.name, NS, grace_period_seconds=0)
    deadline = time.monotonic() + 120
    while True:  # until the DaemonSet's new pod runs; the placements never change meanwhile
        assert (c.cpus(g), c.cpus(b)) == (held, shared)
        new = [p for p in c.pods("cri-resmgr-nri") if p.metadata.uid != old.metadata.uid and any(
            x.type == "Ready" and x.status == "True" for x in p.status.conditions or [])]
        if new and "NRI: synchronized" in c.core.read_namespaced_pod_log(new[0].metadata.name, NS):
            break  # the new plugin has synchronized with containerd: what it restored stands
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert (c.cpus(g), c.cpus(b)) == (held, shared)
    assert active_policy(c) == "static"
    for name in ("exclusive-through-kill", "shared-through-kill"):
        c.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    wait_gone_pods(c, "default")


def release(c: Cluster) -> list[dict[str, Any]]:
    return json.loads(c.helm("history", "cri-resmgr", "--namespace", NS, "--output", "json"))


def test_an_upgrade_over_a_kubectl_edit_of_the_charts_configuration_stops_before_anything_rolls(cluster):
    """The chart owns "default": an upgrade after a kubectl edit of it fails before it applies anything
    (no server-side apply conflict half-way, no half-rolled release) and says how to go on."""
    c = cluster
    c.install()
    ds = c.apps.read_namespaced_daemon_set("cri-resmgr-nri", NS)
    revisions = release(c)
    c.custom.patch_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.PLURAL, "default",
                                            {"spec": {"policy": {"Active": "none"}}})
    out = helm.helm("--kubeconfig", str(c.control.admin_kubeconfig), "upgrade", "cri-resmgr", str(helm.CHART),
                    "--namespace", NS, *helm._sets({**c.values, "nri.extraArgs": ["--log-level=DEBUG"]}))
    assert out.returncode != 0 and "was changed outside Helm" in out.stderr, out
    assert f"kubectl -n {NS} delete rmconfig default" in out.stderr, out
    assert release(c) == revisions  # no new revision, failed or otherwise
    assert c.apps.read_namespaced_daemon_set("cri-resmgr-nri", NS).metadata.generation == ds.metadata.generation
    # As the message says: handed back to the chart, the next upgrade goes through.
    kubectl = helm.HELM.parent / "kubectl"
    subprocess.run([str(kubectl), "--kubeconfig", str(c.control.admin_kubeconfig), "-n", NS, "delete", "rmconfig",
                    "default"], check=True, timeout=60)
    c.install()
    spec = c.custom.get_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.PLURAL, "default")["spec"]
    assert spec["policy"]["Active"] == "static"
    assert release(c)[-1]["status"] == "deployed"


def test_helm_wait_fails_while_the_plugin_crash_loops_or_cannot_serve(cluster):
    """The plugin's probes: an upgrade whose plugin exits at start (a value the schema cannot judge, an
    argument the daemon refuses) or never registers with the runtime is not "deployed"."""
    c = cluster
    for args in (["--log-level=LOUD"], ["--nri-socket=/run/nowhere/nri.sock"]):
        out = helm.helm("--kubeconfig", str(c.control.admin_kubeconfig), "upgrade", "cri-resmgr", str(helm.CHART),
                        "--namespace", NS, "--wait", "--timeout", "20s",
                        *helm._sets({**c.values, "nri.extraArgs": args, "nri.startupSeconds": 20}))
        assert out.returncode != 0, (args, out.stdout)
        assert release(c)[-1]["status"] == "failed", args
        failing = [p for p in c.pods("cri-resmgr-nri") if not any(
            x.type == "Ready" and x.status == "True" for x in p.status.conditions or [])]
        assert failing, f"the plugin run with {args} counts as Ready"
        c.helm("rollback", "cri-resmgr", "--namespace", NS, "--wait", "--timeout", "120s")
        c.ready("cri-resmgr-nri")


def synchronized_plugin(c: Cluster, image: str) -> Any:
    """The plugin pod running image, once Ready and synchronized with containerd."""
    deadline = time.monotonic() + 180
    while True:
        pods = [p for p in c.ready("cri-resmgr-nri") if image.endswith(p.spec.containers[0].image)]
        if pods and "NRI: synchronized" in c.core.read_namespaced_pod_log(pods[0].metadata.name, NS):
            return pods[0]
        assert time.monotonic() < deadline, (image, c.logs("cri-resmgr-nri"))
        time.sleep(1)


def test_helm_upgrade_from_the_previous_release_and_rollback_keep_every_pod(cluster, previous_release):
    """The previous release (its chart and image, built from git) installed with pods running, upgraded
    to this tree and rolled back, under topology-aware: a kube-system pod on the reserved CPU and a
    pod whose CPU comes from a ResourceClaim. No workload container restarts, each keeps its CPUs, the
    claim stays prepared, and each version reads the other's state: the rolled-back release
    unprepares the claim the upgraded one held."""
    c, rel = cluster, previous_release
    values = {**c.values, "config": {"policy": {"Active": "topology-aware", "ReservedResources": {"cpu": "cpuset:0"}}}}
    c.helm("uninstall", "cri-resmgr", "--namespace", NS, "--wait", "--timeout", "120s")
    for app in ("cri-resmgr-nri", "cri-resmgr-agent", "cri-resmgr-webhook"):
        wait_gone(c, app)
    old_image = productimage.load(productimage.build_release(rel.src), c.node.ctrd.socket, rel.version)
    c.helm("install", "cri-resmgr", str(rel.src / "deployment" / "helm" / "cri-resmgr"), "--namespace", NS,
           "--wait", "--timeout", "180s", *helm._sets({**values, "image.tag": rel.version}))
    synchronized_plugin(c, old_image)
    deadline = time.monotonic() + 90
    while c.devices() != {"numa-0": "1"}:  # topology-aware is active and its device published
        assert time.monotonic() < deadline, (c.devices(), c.logs("cri-resmgr-agent"), c.logs("cri-resmgr-nri"))
        time.sleep(1)
    c.claim("across-versions", "1")
    pods = {"reserved": c.run("reserved-across-versions", "100m", guaranteed=False, namespace=NS),
            "claimed": c.run("claimed-across-versions", "", guaranteed=False, claim="across-versions")}
    placed = {"reserved": CPUSet.parse("0"), "claimed": CPUSet.parse("1")}
    assert {k: c.cpus(pod) for k, pod in pods.items()} == placed
    specs = sorted(p.name for p in c.node.ctrd.cdi_dir.iterdir())
    assert specs, "the claim's CDI spec"

    def unchanged() -> None:
        for key, pod in pods.items():
            now = c.core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
            assert container_ids(now) == container_ids(pod)
            assert sum(s.restart_count for s in now.status.container_statuses) == 0
            assert c.cpus(now) == placed[key]
        assert sorted(p.name for p in c.node.ctrd.cdi_dir.iterdir()) == specs

    c.helm("upgrade", "cri-resmgr", str(helm.CHART), "--namespace", NS, "--wait", "--timeout", "180s",
           *helm._sets(values))
    new = synchronized_plugin(c, c.image)
    assert "unusable" not in c.core.read_namespaced_pod_log(new.metadata.name, NS)
    unchanged()
    c.helm("rollback", "cri-resmgr", "--namespace", NS, "--wait", "--timeout", "180s")
    back = synchronized_plugin(c, old_image)
    assert "unusable" not in c.core.read_namespaced_pod_log(back.metadata.name, NS)
    unchanged()
    c.core.delete_namespaced_pod("claimed-across-versions", "default", grace_period_seconds=0)
    wait_gone_pods(c, "default")
    c.custom.delete_namespaced_custom_object("resource.k8s.io", "v1", "default", "resourceclaims", "across-versions")
    deadline = time.monotonic() + 60
    while list(c.node.ctrd.cdi_dir.iterdir()):  # unprepared by the release that did not prepare it
        assert time.monotonic() < deadline, c.logs("cri-resmgr-nri")
        time.sleep(0.5)
    c.core.delete_namespaced_pod("reserved-across-versions", NS, grace_period_seconds=0)
    c.install()  # this tree again, for what follows
    synchronized_plugin(c, c.image)


def wait_gone_pods(c: Cluster, namespace: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while c.core.list_namespaced_pod(namespace).items:
        assert time.monotonic() < deadline, "pods still there"
        time.sleep(1)


def wait_gone(c: Cluster, app: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while c.pods(app):
        assert time.monotonic() < deadline, f"{app} pods still there"
        time.sleep(1)


def test_helm_uninstall_leaves_pods_running_and_new_ones_start_without_the_plugin(cluster):
    c = cluster
    c.install()
    c.ready("cri-resmgr-nri")
    kept = c.run("kept", "1", guaranteed=True)
    before = c.cpus(kept)
    c.helm("uninstall", "cri-resmgr", "--namespace", NS, "--wait", "--timeout", "120s")
    for app in ("cri-resmgr-nri", "cri-resmgr-agent", "cri-resmgr-webhook"):
        wait_gone(c, app)
    pod = c.core.read_namespaced_pod("kept", "default")
    assert container_ids(pod) == container_ids(kept) and c.cpus(pod) == before  # still running, where it was
    after = c.run("after", "1", guaranteed=True)  # containerd without the plugin: the whole machine
    assert c.cpus(after) == ONLINE
    # The CRD stays (Helm never deletes what crds/ installed); the state directory stays on the node.
    assert (c.state_dir / "cache").exists()
    assert c.custom.list_namespaced_custom_object(rs.GROUP, rs.VERSION, NS, rs.PLURAL)["items"] == []
    for name in ("kept", "after"):
        c.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    # Nothing of ours on the node but the state: the sockets went with the plugin (the directories
    # are the chart's hostPath volumes, made by kubelet).
    assert [p.name for p in Path(c.values["socketDir"]).iterdir()] == []
