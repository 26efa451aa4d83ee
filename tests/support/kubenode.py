"""A Kubernetes node for tests: a private containerd, cri-resmgr in front of it (relay) or inside it
(NRI) or neither (direct), and a real kubelet of a harness.kube control plane. Pods are made and
deleted through the API server; what they run on is read from containerd and the cgroups."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from harness.containerd import PrivateContainerd
from harness.kube import ControlPlane, Kubelet, container_ids, describe, pod_manifest
from harness.relay import NriProcess, RelayProcess, policy_nri, policy_relay
from resmgr.topology.cpuset import CPUSet
from tests.support.helpers import Cri, cgroup_cpus, container_cgroup

NAMESPACE = "default"


def scratch() -> Path:
    """A short work directory of a node (unix socket paths are limited to 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix="crirm-"))


def done_with(path: Path) -> None:
    """Remove a work directory, unless CRIRM_KEEP_WORKDIR=1 asks to keep the logs."""
    if not os.environ.get("CRIRM_KEEP_WORKDIR"):
        shutil.rmtree(path, ignore_errors=True)


class KubeNode:
    def __init__(self, control: ControlPlane, workdir: Path, front: str = "relay", policy: str = "static",
                 relay_mode: str = "splice", reserved: str = "cpuset:0", node: str = "crirm-node",
                 cpu_manager: str = "none", relay_args: tuple[str, ...] = (), **kubelet_settings: Any) -> None:
        """policy "" leaves the relay's configuration to relay_args and what is pushed to it; relay_args
        are cri-resmgr's in NRI mode too."""
        self.control, self.workdir, self.front, self.node = control, workdir, front, node
        workdir.mkdir(parents=True, exist_ok=True)
        self.ctrd = PrivateContainerd(workdir / "ctrd")
        self.resmgr: RelayProcess | None = None
        if front == "relay":
            # Every call in the log, with its outcome ("<kind> <Method> ok|error ...").
            args = ("--relay-mode", relay_mode, "--dump", "short:.*", *relay_args)
            self.resmgr = policy_relay(workdir, self.ctrd.socket, policy, *args, reserved=reserved) if policy \
                else RelayProcess(workdir, self.ctrd.socket, *args)
        elif front == "nri":
            sock = str(self.ctrd.dir / "nri.sock")
            self.resmgr = policy_nri(workdir, sock, policy, "--hook-dir", "disabled", *relay_args,
                                     reserved=reserved) if policy else \
                NriProcess(workdir, sock, "--hook-dir", "disabled", *relay_args)
        endpoint = self.resmgr.socket if front == "relay" and self.resmgr else self.ctrd.socket
        self.kubelet = Kubelet(control, workdir / "kubelet", endpoint, node, cpu_manager=cpu_manager,
                               **kubelet_settings)
        self.direct: Cri | None = None
        self.core = control.core()

    def start(self) -> KubeNode:
        self.ctrd.start()
        self.direct = Cri(self.ctrd.socket)
        if self.resmgr is not None:
            self.resmgr.start()
        self.control.ensure_namespace(NAMESPACE)
        self.kubelet.start()
        return self

    def stop(self) -> None:
        """Delete this node's pods and Node object, then stop everything (nothing left for the next node)."""
        try:
            for pod in self.pods():
                self.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)
            self.core.delete_node(self.node)
        except client.ApiException:
            pass
        self.kubelet.stop()
        if self.direct is not None:
            self.ctrd.remove_all_pods()
            self.direct.close()
        if self.resmgr is not None and self.resmgr.proc is not None:
            self.resmgr.stop()
        self.ctrd.stop()
        self.kubelet.cleanup()

    # -- pods ----------------------------------------------------------------------------------
    def run(self, name: str, timeout: float = 60, **manifest: Any) -> Any:
        """Create a pod on this node through the API; the pod once all its containers run."""
        self.core.create_namespaced_pod(NAMESPACE, pod_manifest(name, self.node, **manifest))
        return self.wait_running(name, timeout)

    def wait_running(self, name: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            pod = self.core.read_namespaced_pod(name, NAMESPACE)
            if len(container_ids(pod)) == len(pod.spec.containers):
                return pod
            if time.monotonic() > deadline:
                raise AssertionError(f"pod {name} not running after {timeout}s: {describe(pod)}")
            time.sleep(0.2)

    def delete(self, name: str, timeout: float = 60) -> None:
        """Delete a pod through the API and wait until the kubelet has finished it (the object is gone)."""
        self.core.delete_namespaced_pod(name, NAMESPACE)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.core.read_namespaced_pod(name, NAMESPACE)
            except client.ApiException as err:
                if err.status == 404:
                    return
                raise
            if time.monotonic() > deadline:
                raise AssertionError(f"pod {name} still there {timeout}s after its deletion")
            time.sleep(0.2)

    def cpus(self, name: str) -> dict[str, CPUSet]:
        """container name -> the CPUs of its cgroup, of a running pod."""
        assert self.direct is not None
        pod = self.core.read_namespaced_pod(name, NAMESPACE)
        return {c: cgroup_cpus(*container_cgroup(self.direct, cid)) for c, cid in container_ids(pod).items()}

    def pods(self) -> list[Any]:
        """This node's pod objects."""
        return self.core.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={self.node}").items

    def restarts(self) -> dict[str, int]:
        """pod name -> restarts of its containers, for this node's pods."""
        return {p.metadata.name: sum(s.restart_count for s in p.status.container_statuses or []) for p in self.pods()}

    def last_ends(self) -> dict[str, str]:
        """pod name -> its restarted containers' restarts and how the previous attempt ended (reason,
        exit code, message, where kubelet kept it), for this node's pods with any restart."""
        out = {}
        for p in self.pods():
            for st in p.status.container_statuses or []:
                if not st.restart_count:
                    continue
                ended = st.last_state.terminated if st.last_state else None
                how = (f"{ended.reason} exit {ended.exit_code} started {ended.started_at} {ended.message or ''}"
                       if ended else "not kept")
                out[p.metadata.name] = f"{st.restart_count} restart(s), last: {how}".strip()
        return out


_KLOG = re.compile(r"^E\d{4} [\d:.]+\s+\d+ (\S+:\d+)\] \"?([^\"=]*)")
# What a busy machine makes a kubelet log whatever its runtime: races between its start-up and the
# API server (the Node object not registered yet: CSINode, mirror pods, leases), a lease written by
# two of its loops at once or late, a housekeeping round over its one-second budget, cAdvisor's read
# of the node's own cgroups ("system containers") racing with a pod cgroup going away, the API
# server's node authorizer refusing a status read of a pod its graph has not linked to the node yet.
_NOT_RUNTIME = re.compile(r'nodes? \\?"[^"\\]+\\?" not found|CSINode|Failed to update lease|'
                          r'Housekeeping took longer than expected|Failed to get system container stats|'
                          r'no relationship found between node')


def error_kinds(log: str) -> set[str]:
    """The kinds of error a kubelet logged ('file.go:line message' of each E line), but for those
    about the API server's view of the node."""
    kinds = set()
    for line in log.splitlines():
        m = _KLOG.match(line)
        if m and not _NOT_RUNTIME.search(line):
            kinds.add(f"{m.group(1)} {m.group(2).strip()}")
    return kinds
