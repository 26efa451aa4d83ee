"""The test node VM as a node: cri-resmgr as a systemd service there, pods made with crictl or
through the guest's kubelet, what runs where read from the guest's cgroup v2 files.

Shared by the VM tier (tests/vm/) and the soak (harness/soak/).
"""

from __future__ import annotations

import json
import time
import uuid

from kubernetes.client import ApiException

from harness.kube import KUBELET_CONFIG, ControlPlane, container_ids, describe, pod_manifest
from harness.vm import HOST_ADDRESS, Vm
from resmgr.topology.cpuset import CPUSet

RELAY_SOCKET = "/var/run/cri-resmgr/cri-resmgr.sock"
CONTAINERD_SOCKET = "/var/run/containerd/containerd.sock"
BUSYBOX = "localhost/cri-resmgr/busybox:test"
API_PORT = 6443
NODE_NAME = "crirm-node"


class Node:
    """The guest as a node: cri-resmgr as a systemd service, pods made with crictl."""

    def __init__(self, vm: Vm) -> None:
        self.vm = vm

    def sh(self, command: str, timeout: float = 120.0) -> str:
        return self.vm.sh(command, timeout)

    def crictl(self, args: str, socket: str = RELAY_SOCKET, timeout: float = 120.0) -> str:
        return self.sh(f"crictl --runtime-endpoint unix://{socket} {args}", timeout).strip()

    def install_service(self) -> None:
        """The project's own unit file, as the package installs it."""
        self.sh("cp /opt/cri-resmgr/src/config/cri-resmgr.service /etc/systemd/system/ && systemctl daemon-reload")

    def fresh(self, config: str, mode: str = "relay") -> None:
        """No pods, no state, cri-resmgr started with this configuration."""
        self.sh("systemctl stop cri-resmgr.service cri-resmgr-nri.service 2>/dev/null; "
                f"crictl --runtime-endpoint unix://{CONTAINERD_SOCKET} rmp -af >/dev/null 2>&1; "
                "rm -rf /var/lib/cri-resmgr; true")
        self.vm.write("/etc/cri-resmgr/fallback.yaml", config)
        self.sh(f"systemctl start {'cri-resmgr' if mode == 'relay' else 'cri-resmgr-nri'}.service")
        if mode == "relay":
            self.sh(f"for i in $(seq 600); do [ -S {RELAY_SOCKET} ] && exit 0; sleep 0.1; done; "
                    "journalctl -u cri-resmgr --no-pager | tail -20; exit 1")
        else:
            self.sh("for i in $(seq 600); do journalctl -u cri-resmgr-nri --no-pager | grep -q 'NRI: synchronized' "
                    "&& exit 0; sleep 0.1; done; journalctl -u cri-resmgr-nri --no-pager | tail -20; exit 1")

    def pod(self, name: str, qos: str, cpu: str = "", memory: str = "", command: str = "sleep 3600",
            socket: str = RELAY_SOCKET, annotations: dict[str, str] | None = None) -> tuple[str, str]:
        """A pod of one container, as kubelet with the systemd cgroup driver makes it; (pod, container)."""
        uid = str(uuid.uuid4())
        slice_uid = uid.replace("-", "_")
        parent = {"guaranteed": f"kubepods-pod{slice_uid}.slice",
                  "burstable": f"kubepods-burstable-pod{slice_uid}.slice",
                  "besteffort": f"kubepods-besteffort-pod{slice_uid}.slice"}[qos]
        pod = {"metadata": {"name": name, "namespace": "default", "uid": uid},
               "log_directory": f"/var/log/pods/{name}", "linux": {"cgroup_parent": parent},
               "annotations": annotations or {}}
        res: dict[str, int] = {}
        if cpu:
            milli = int(cpu[:-1]) if cpu.endswith("m") else int(cpu) * 1000
            res["cpu_shares"] = max(2, milli * 1024 // 1000)
            if qos == "guaranteed":
                res["cpu_period"], res["cpu_quota"] = 100000, milli * 100
        if memory and qos == "guaranteed":
            res["memory_limit_in_bytes"] = _bytes(memory)
        ctr = {"metadata": {"name": "main"}, "image": {"image": BUSYBOX}, "command": ["sh", "-c", command],
               "log_path": "main.log", "linux": {"resources": res}}
        self.vm.write(f"/tmp/{name}-pod.json", json.dumps(pod))
        self.vm.write(f"/tmp/{name}-ctr.json", json.dumps(ctr))
        pid = self.crictl(f"runp /tmp/{name}-pod.json", socket)
        cid = self.crictl(f"create {pid} /tmp/{name}-ctr.json /tmp/{name}-pod.json", socket)
        self.crictl(f"start {cid}", socket)
        return pid, cid

    def scope(self, cid: str) -> str:
        """The container's cgroup (a systemd scope under its pod's slice)."""
        found = self.sh(f"find /sys/fs/cgroup/kubepods.slice -type d -name 'cri-containerd-{cid}.scope'").split()
        assert len(found) == 1, f"container {cid}: cgroups {found}"
        return found[0]

    def cpuset(self, cid: str) -> tuple[CPUSet, CPUSet]:
        scope = self.scope(cid)
        cpus, mems = self.sh(f"cat {scope}/cpuset.cpus.effective {scope}/cpuset.mems.effective").split("\n")[:2]
        return CPUSet.parse(cpus), CPUSet.parse(mems)

    def memory_by_node(self, cid: str) -> dict[int, int]:
        """Bytes of the container's memory on each NUMA node, from memory.numa_stat (anon and shmem)."""
        by_node: dict[int, int] = {}
        for line in self.sh(f"cat {self.scope(cid)}/memory.numa_stat").splitlines():
            key, *fields = line.split()
            if key in ("anon", "shmem"):
                for f in fields:
                    node, value = f.lstrip("N").split("=")
                    by_node[int(node)] = by_node.get(int(node), 0) + int(value)
        return by_node

    def status(self) -> dict:
        """The daemon's state document (pools, pods and their containers). The emulated guest runs
        an order of magnitude slower than hardware, and busier still while new containers start, so
        the call is given far longer than the command's default of 5 s."""
        return json.loads(self.sh("cri-resmgr status --timeout 60s --output json", timeout=120))["state"]


def _bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for suffix, mult in units.items():
        if quantity.endswith(suffix):
            return int(quantity[:-2]) * mult
    return int(quantity)


class Kubelet:
    """The guest's kubelet as kubeadm sets one up on cgroup v2: the systemd cgroup driver, and
    failCgroupV1 left at its default (true)."""

    def __init__(self, node: Node, control: ControlPlane) -> None:
        self.node, self.control = node, control
        crt, key = control.pki.issue(f"kubelet-{NODE_NAME}", f"system:node:{NODE_NAME}", ("system:nodes",))
        for path in (crt, key, control.pki.ca):
            node.vm.write(f"/etc/kubernetes/pki/{path.name}", path.read_bytes())
        kubeconfig = {
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "test", "cluster": {
                "server": f"https://{HOST_ADDRESS}:{API_PORT}", "tls-server-name": "localhost",
                "certificate-authority": f"/etc/kubernetes/pki/{control.pki.ca.name}"}}],
            "users": [{"name": "node", "user": {"client-certificate": f"/etc/kubernetes/pki/{crt.name}",
                                                "client-key": f"/etc/kubernetes/pki/{key.name}"}}],
            "contexts": [{"name": "node", "context": {"cluster": "test", "user": "node"}}]}
        node.vm.write("/etc/kubernetes/kubelet.kubeconfig", json.dumps(kubeconfig))
        control.ensure_namespace("default")

    def start(self, runtime_socket: str, **more: object) -> None:
        """kubelet on this CRI socket (and more settings), enabled so that it comes back after a reboot."""
        settings = {k: v for k, v in KUBELET_CONFIG.items() if k != "failCgroupV1"}
        settings.update({"cgroupDriver": "systemd", "containerRuntimeEndpoint": "unix://" + runtime_socket,
                         "resolvConf": "", "nodeStatusUpdateFrequency": "10s", **more})
        self.node.vm.write("/etc/kubernetes/kubelet.yaml", json.dumps(settings))
        self.node.sh("systemctl enable kubelet.service && systemctl restart kubelet.service")
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 300
        while True:
            try:
                got = self.control.core().read_node(NODE_NAME, _request_timeout=5)
                if any(c.type == "Ready" and c.status == "True" for c in got.status.conditions or []):
                    return
            except ApiException as err:
                if err.status != 404:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError("kubelet: node not Ready:\n" + self.node.sh(
                    "journalctl -u kubelet --no-pager | tail -30"))
            time.sleep(2)

    def stop(self) -> None:
        """Every pod deleted as a user deletes it (kubelet stops its containers before the pod is
        gone), forced only if kubelet cannot; then kubelet stopped."""
        core = self.control.core()
        for force in (False, True):
            for pod in core.list_namespaced_pod("default").items:
                core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0 if force else None)
            deadline = time.monotonic() + 120
            while core.list_namespaced_pod("default").items and time.monotonic() < deadline:
                time.sleep(2)
        self.node.sh("systemctl disable --now kubelet.service")

    def running(self) -> dict[str, str]:
        """pod name -> its running container's runtime ID."""
        pods = self.control.core().list_namespaced_pod("default").items
        return {p.metadata.name: ids["c0"] for p in pods if (ids := container_ids(p))}

    def restarts(self) -> dict[str, int]:
        """pod name -> its container's restart count."""
        pods = self.control.core().list_namespaced_pod("default").items
        return {p.metadata.name: sum(s.restart_count for s in p.status.container_statuses or []) for p in pods}

    def run(self, name: str, cpu: str = "", memory: str = "", limits: bool = False) -> str:
        """A pod on the node; its container's runtime ID once it runs."""
        core = self.control.core()
        core.create_namespaced_pod("default", pod_manifest(name, NODE_NAME, cpu, memory, limits))
        deadline = time.monotonic() + 240
        while True:
            pod = core.read_namespaced_pod(name, "default")
            ids = container_ids(pod)
            if ids:
                return ids["c0"]
            if time.monotonic() > deadline:
                raise TimeoutError(f"pod {name} did not run: {describe(pod)}")
            time.sleep(1)
