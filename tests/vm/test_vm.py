"""The test node as a virtual machine shaped like production: systemd as init, cgroup v2 only,
containerd with the systemd cgroup driver, 2 packages x 2 NUMA nodes x 2 cores x 2 threads
(nri-plugins' n4c16 machine) with memory on every node. Everything is judged inside the guest,
from its cgroup v2 files and from what cri-resmgr reports.

Run with `scripts/test.sh --vm` (the image is built on first use and cached; see harness/vm.py).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.soak.guest import DPKG_OPTIONS
from harness.vm import GuestError, Shape
from harness.vmnode import CONTAINERD_SOCKET, RELAY_SOCKET, Kubelet, Node
from resmgr.topology.cpuset import CPUSet

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(1800)

SHAPE = Shape()

TOPOLOGY_AWARE = "policy:\n  Active: topology-aware\n  ReservedResources:\n    cpu: 1\n"
BALLOONS = """policy:
  Active: balloons
  ReservedResources:
    cpu: 1
  balloons:
    BalloonTypes:
      - Name: quad
        MaxCPUs: 4
        Namespaces: ["*"]
"""
PODS = [  # for simulate, in the order the tests make them
    {"name": "g2", "qos": "guaranteed", "cpu": "2", "memory": "128Mi"},
    {"name": "g3", "qos": "guaranteed", "cpu": "3", "memory": "128Mi"},
    {"name": "b1", "qos": "burstable", "cpu": "500m", "memory": "64Mi"},
]


def node_of(cpus: CPUSet) -> set[int]:
    per = SHAPE.cores_per_node * SHAPE.threads
    return {c // per for c in cpus}


@pytest.fixture(scope="module")
def node(vm):
    """The guest as a node, cri-resmgr's unit from the checkout (tests/vm/conftest.py boots it)."""
    n = Node(vm)
    n.install_service()
    return n


def test_the_node_is_shaped_like_production(node):
    assert node.sh("stat -fc %T /sys/fs/cgroup").strip() == "cgroup2fs"
    assert node.sh("cat /proc/1/comm").strip() == "systemd"
    controllers = set(node.sh("cat /sys/fs/cgroup/cgroup.controllers").split())
    assert {"cpuset", "cpu", "io", "memory"} <= controllers
    assert "SystemdCgroup = true" in node.sh("cat /etc/containerd/config.toml")
    assert node.sh("ls -d /sys/devices/system/node/node*").split() == [
        f"/sys/devices/system/node/node{n}" for n in range(SHAPE.nodes)]
    assert CPUSet.parse(node.sh("cat /sys/devices/system/cpu/online").strip()) == CPUSet(range(SHAPE.cpus))
    for n in range(SHAPE.nodes):
        assert node.sh(f"cat /sys/devices/system/node/node{n}/cpulist").strip() == SHAPE.node_cpus(n)


def simulate_host(config: str) -> dict:
    """What `cri-resmgr simulate --machine` predicts on the host for the same shape."""
    with tempfile.TemporaryDirectory() as d:
        cfg, pods = Path(d) / "config.yaml", Path(d) / "pods.yaml"
        cfg.write_text(config)
        pods.write_text(json.dumps(_sim_pods()))
        out = subprocess.run([sys.executable, "-m", "resmgr", "simulate", "--machine", SHAPE.machine(),
                              "--config", str(cfg), "--pods", str(pods), "--output", "json"],
                             check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def _sim_pods() -> list[dict]:
    return [{"name": p["name"],
             "containers": [{"name": "main", "requests": {"cpu": p["cpu"], "memory": p["memory"]},
                             **({"limits": {"cpu": p["cpu"], "memory": p["memory"]}}
                                if p["qos"] == "guaranteed" else {})}]} for p in PODS]


def simulate_guest(node: Node, config: str) -> dict:
    node.vm.write("/tmp/sim-config.yaml", config)
    node.vm.write("/tmp/sim-pods.yaml", json.dumps(_sim_pods()))
    return json.loads(node.sh("cri-resmgr simulate --config /tmp/sim-config.yaml --pods /tmp/sim-pods.yaml "
                              "--output json"))


@pytest.mark.parametrize("config", [TOPOLOGY_AWARE, BALLOONS], ids=["topology-aware", "balloons"])
def test_the_guest_topology_gives_the_pools_simulate_predicts(node, config):
    guest, host = simulate_guest(node, config), simulate_host(config)
    # The same pools, CPUs and memory nodes; the memory sizes are the guest's own.
    assert all(p.pop("memory", {}).get("dram", 0) > 0 for p in guest["pools"] if p.get("mems")), guest["pools"]
    for p in host["pools"]:
        p.pop("memory", None)
    assert guest["pools"] == host["pools"]
    assert [(c["pod"], c["pool"], c["cpus"], c["mems"]) for c in guest["containers"]] == \
        [(c["pod"], c["pool"], c["cpus"], c["mems"]) for c in host["containers"]]


@pytest.mark.parametrize("config", [TOPOLOGY_AWARE, BALLOONS], ids=["topology-aware", "balloons"])
def test_guaranteed_containers_sit_in_one_numa_node_and_their_memory_too(node, config):
    node.fresh(config)
    # Each writes 48 MiB into its pod's /dev/shm (tmpfs: charged to it, placed by its cpuset.mems).
    fill = "dd if=/dev/zero of=/dev/shm/fill bs=1M count=48 2>/dev/null; sleep 3600"
    made = {p["name"]: node.pod(p["name"], p["qos"], p["cpu"], p["memory"], command=fill) for p in PODS}
    reported = {c["id"]: c for p in node.status()["pods"] for c in p["containers"]}
    predicted = {c["pod"].split("/")[-1]: (CPUSet.parse(c["cpus"]), CPUSet.parse(c["mems"]))
                 for c in simulate_host(config)["containers"]}
    # The kernel enforces what simulate predicts for a machine of this shape.
    assert {name: node.cpuset(cid) for name, (_, cid) in made.items()} == predicted
    for name in ("g2", "g3"):
        _, cid = made[name]
        cpus, mems = node.cpuset(cid)
        assert len(cpus) >= int(next(p["cpu"] for p in PODS if p["name"] == name))  # a balloon may hold more
        assert len(node_of(cpus)) == 1, f"{name} got CPUs {cpus} across NUMA nodes"
        assert set(mems) == node_of(cpus), f"{name}: CPUs {cpus} but memory nodes {mems}"
        # What cri-resmgr reports is what the kernel enforces.
        assert (CPUSet.parse(reported[cid]["cpus"]), CPUSet.parse(reported[cid]["mems"])) == (cpus, mems)
        deadline = time.monotonic() + 60
        while sum((used := node.memory_by_node(cid)).values()) < 48 << 20 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert sum(used.values()) >= 48 << 20, used
        assert used.get(min(mems), 0) >= 0.95 * sum(used.values()), f"{name}: memory by node {used}"
    node.sh(f"crictl --runtime-endpoint unix://{RELAY_SOCKET} rmp -af")


def test_qos_classes_are_read_from_systemd_slice_names(node):
    node.fresh(TOPOLOGY_AWARE)
    for name, qos in (("q-g", "guaranteed"), ("q-b", "burstable"), ("q-be", "besteffort")):
        node.pod(name, qos, "1" if qos == "guaranteed" else ("250m" if qos == "burstable" else ""),
                 "64Mi" if qos == "guaranteed" else "")
    pods = {p["name"]: p for p in node.status()["pods"]}
    assert {n: pods[n]["qos_class"] for n in ("q-g", "q-b", "q-be")} == {
        "q-g": "Guaranteed", "q-b": "Burstable", "q-be": "BestEffort"}
    node.sh(f"crictl --runtime-endpoint unix://{RELAY_SOCKET} rmp -af")


def test_guest_commands_report_failures(node):
    result = node.vm.run("echo out; echo err >&2; exit 3")
    assert (result.code, result.out, result.err) == (3, "out\n", "err\n")
    assert node.vm.run(f"cat {shlex.quote('/no such file')}").code != 0


@pytest.fixture(scope="module")
def kubelet(node, kube):
    k = Kubelet(node, kube)
    yield k
    k.stop()


@pytest.mark.parametrize("mode", ["relay", "nri"])
def test_kubelet_with_the_systemd_driver_runs_pods_of_each_qos_class(node, kubelet, mode):
    node.fresh(TOPOLOGY_AWARE, mode)
    kubelet.start(RELAY_SOCKET if mode == "relay" else CONTAINERD_SOCKET)
    try:
        ids = {"g": kubelet.run(f"{mode}-g", "2", "128Mi", limits=True),
               "b": kubelet.run(f"{mode}-b", "500m", "64Mi"),
               "be": kubelet.run(f"{mode}-be")}
        # kubelet's own slices, named by the systemd driver, hold each pod's scope.
        for key, slice_name in (("g", "kubepods-pod"), ("b", "kubepods-burstable-pod"),
                                ("be", "kubepods-besteffort-pod")):
            assert f"/{slice_name}" in node.scope(ids[key]), (key, node.scope(ids[key]))
        cpus, mems = node.cpuset(ids["g"])
        assert len(cpus) == 2 and len(node_of(cpus)) == 1 and set(mems) == node_of(cpus), (cpus, mems)
        shared, _ = node.cpuset(ids["b"])
        assert not shared & cpus, f"the Burstable container shares the Guaranteed one's CPUs {cpus}"
        pods = {p["name"]: p["qos_class"] for p in node.status()["pods"]}
        assert {pods[f"{mode}-{k}"] for k in ids} == {"Guaranteed", "Burstable", "BestEffort"}, pods
    finally:
        kubelet.stop()


def test_block_io_classes_land_in_io_max_and_the_weights_of_the_container_scope(node):
    # Weights per device need the device's scheduler to weigh them: bfq, as an operator sets it.
    node.sh("modprobe bfq && echo bfq > /sys/block/vda/queue/scheduler")
    node.fresh(TOPOLOGY_AWARE + """blockio:
  Classes:
    BestEffort:
      - Devices: [/dev/vda]
        ThrottleWriteBps: 20M
        ThrottleReadIOPS: 500
        Weight: 50
    Burstable:
      - Weight: 200
""")
    _, slow = node.pod("io-be", "besteffort")
    _, free = node.pod("io-b", "burstable", "250m")
    dev = node.sh("cat /sys/block/vda/dev").strip()
    want = {slow: ["default 100", f"{dev} 50"], free: ["default 200"]}
    # The classes are written after the start, throttles before weights: wait for the last write.
    deadline = time.monotonic() + 30
    while (weights := {c: node.sh(f"cat {node.scope(c)}/io.bfq.weight").splitlines() for c in want}) != want \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert weights == want, weights
    limits = node.sh(f"cat {node.scope(slow)}/io.max")
    assert f"{dev} rbps=max wbps=20000000 riops=500 wiops=max" in limits, limits
    assert node.sh(f"cat {node.scope(free)}/io.max").strip() == "", "a class without throttles got some"
    assert "weights cannot be set" not in node.sh("journalctl -u cri-resmgr --no-pager")
    node.sh(f"crictl --runtime-endpoint unix://{RELAY_SOCKET} rmp -af; "
            "echo mq-deadline > /sys/block/vda/queue/scheduler")


def movable_interrupt(node: Node) -> tuple[int, str, str]:
    """An interrupt of the guest the kernel lets move (IO-APIC ones do; managed MSI vectors do not):
    (number, description, its affinity now)."""
    for line in node.sh("cat /proc/interrupts").splitlines():
        fields = line.split()
        if not fields or not fields[0].rstrip(":").isdigit() or "IO-APIC" not in line:
            continue
        irq = int(fields[0].rstrip(":"))
        now = node.sh(f"cat /proc/irq/{irq}/smp_affinity_list").strip()
        if node.sh(f"echo {now} > /proc/irq/{irq}/smp_affinity_list && echo ok || true").strip() == "ok":
            return irq, " ".join(f for f in fields[1:] if not f.isdigit()), now
    pytest.fail("no movable interrupt in the guest:\n" + node.sh("cat /proc/interrupts"))


def test_an_interrupt_follows_the_irq_affinity_annotation_and_comes_back(node):
    # The guest's real interrupts: one claimed by number goes to the container's exclusive CPUs,
    # and back to where it was when the container goes.
    irq, description, before = movable_interrupt(node)
    node.fresh(TOPOLOGY_AWARE)
    _, cid = node.pod("irq-g", "guaranteed", "2", "64Mi",
                      annotations={"irq-affinity.resource-policy.nri.io": f"claim: [{irq}]"})
    cpus, _ = node.cpuset(cid)
    assert len(cpus) == 2
    deadline = time.monotonic() + 30
    while CPUSet.parse(now := node.sh(f"cat /proc/irq/{irq}/smp_affinity_list").strip()) != cpus \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert CPUSet.parse(now) == cpus, f"interrupt {irq} ({description}) on {now}, the container on {cpus}"
    node.sh(f"crictl --runtime-endpoint unix://{RELAY_SOCKET} rmp -af")
    deadline = time.monotonic() + 30
    while (now := node.sh(f"cat /proc/irq/{irq}/smp_affinity_list").strip()) != before \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert now == before, f"interrupt {irq} left on {now}, was {before}"

    # Outside ControllableInterrupts it is refused, the interrupt and the pattern named.
    node.fresh(TOPOLOGY_AWARE + "  topology-aware:\n    ControllableInterrupts: [\"no-such-device\"]\n")
    with pytest.raises(GuestError, match=f"denied interrupt: irq {irq} "):
        node.pod("irq-denied", "guaranteed", "2", "64Mi",
                 annotations={"irq-affinity.resource-policy.nri.io": f"claim: [{irq}]"})
    node.sh(f"crictl --runtime-endpoint unix://{RELAY_SOCKET} rmp -af")


def test_an_in_place_resize_through_kubelet_reaches_the_container_scope(node, kubelet):
    node.fresh(TOPOLOGY_AWARE)
    kubelet.start(RELAY_SOCKET)
    try:
        g = kubelet.run("r-g", "2", "128Mi", limits=True)
        assert len(node.cpuset(g)[0]) == 2
        # Through the API's resize subresource: kubelet resizes the pod's slice, then sends
        # UpdateContainerResources for 3 CPUs through the relay.
        kubelet.control.core().patch_namespaced_pod_resize("r-g", "default", {"spec": {"containers": [
            {"name": "c0", "resources": {"requests": {"cpu": "3", "memory": "128Mi"},
                                         "limits": {"cpu": "3", "memory": "128Mi"}}}]}})
        deadline = time.monotonic() + 90
        while len((placed := node.cpuset(g))[0]) != 3 and time.monotonic() < deadline:
            time.sleep(1)
        cpus, mems = placed
        assert len(cpus) == 3 and len(node_of(cpus)) == 1 and set(mems) == node_of(cpus), placed
        assert node.sh(f"cat {node.scope(g)}/cpu.max").split() == ["300000", "100000"]
        assert kubelet.restarts() == {"r-g": 0}
    finally:
        kubelet.stop()


def test_the_host_package_runs_the_relay_for_kubelet_and_leaves_containerd_to_it_when_removed(node, kubelet):
    """Installed as an operator installs it: dpkg -i, a systemd service, kubelet moved to the relay
    by the package's drop-in, the pod running before taken over; a restart keeps placements; dpkg -r
    gives kubelet back to containerd with every pod still running. (The rollback to the previous
    release's package and the upgrade back with pods running are the soak's every run, and a reboot
    every other: tests/vm/test_soak.py.)"""
    # The unit and command of the checkout give way to the package's.
    node.sh("systemctl stop cri-resmgr.service cri-resmgr-nri.service; "
            f"crictl --runtime-endpoint unix://{CONTAINERD_SOCKET} rmp -af >/dev/null 2>&1; "
            "rm -rf /var/lib/cri-resmgr /etc/systemd/system/cri-resmgr.service /usr/local/bin/cri-resmgr; "
            "systemctl daemon-reload")
    kubelet.start(CONTAINERD_SOCKET)
    try:
        before = kubelet.run("pkg-early", "250m", "64Mi")
        node.vm.write("/etc/cri-resmgr/fallback.yaml", TOPOLOGY_AWARE)  # as configuration management would
        node.sh(f"dpkg -i {DPKG_OPTIONS} /opt/cri-resmgr/src/cri-resmgr.deb", timeout=300)
        assert node.sh("systemctl is-enabled cri-resmgr.service; systemctl is-active cri-resmgr.service").split() \
            == ["enabled", "active"]
        assert "cri-resmgr.sock" in node.sh("cat /etc/kubernetes/kubelet.conf.d/50-cri-resmgr.conf")
        kubelet.wait_ready()
        g = kubelet.run("pkg-g", "2", "128Mi", limits=True)
        placed = node.cpuset(g)
        assert len(placed[0]) == 2 and len(node_of(placed[0])) == 1 and set(placed[1]) == node_of(placed[0])
        names = {p["name"] for p in node.status()["pods"]}
        assert {"pkg-early", "pkg-g"} <= names, names  # the early pod was taken over from containerd
        assert not node.cpuset(before)[0] & placed[0]

        node.sh("systemctl restart cri-resmgr.service")
        node.sh(f"for i in $(seq 600); do [ -S {RELAY_SOCKET} ] && exit 0; sleep 0.1; done; exit 1")
        assert node.cpuset(g) == placed

        node.sh("dpkg -r cri-resmgr", timeout=300)
        assert node.vm.run("test -e /etc/kubernetes/kubelet.conf.d/50-cri-resmgr.conf").code != 0
        assert node.vm.run("systemctl is-active -q cri-resmgr.service").code != 0
        kubelet.wait_ready()
        after = kubelet.run("pkg-after", "250m", "64Mi")  # kubelet talks to containerd again
        running = node.crictl("ps -q", CONTAINERD_SOCKET).split()
        assert {g, after} <= set(running)
    finally:
        kubelet.stop()
