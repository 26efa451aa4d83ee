"""Demo: cri-resmgr in front of a private containerd, with a few sample pods.

Runs pods of each QoS class through the relay, then, once all are running, prints
for every container what it got: the CPUs and memory nodes its processes may use
(read from /proc inside the container), its cgroup's cpuset.cpus, cpuset.mems and
cpu.shares, and the QoS class the relay derived. Everything is removed at the end.

    python -m harness.demo [--policy topology-aware] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from harness.containerd import PrivateContainerd
from harness.images import BUSYBOX_IMAGE
from resmgr.generated.cri import api_pb2 as cri
from resmgr.generated.cri import api_pb2_grpc as cri_grpc

SAMPLES = [
    # (pod name, QoS cgroup component, container resources as kubelet would send them)
    ("besteffort-pod", "besteffort", cri.LinuxContainerResources(cpu_shares=2)),
    ("burstable-pod", "burstable", cri.LinuxContainerResources(
        cpu_shares=512, cpu_quota=100000, cpu_period=100000, memory_limit_in_bytes=256 << 20)),
    ("guaranteed-pod", "", cri.LinuxContainerResources(
        cpu_shares=1024, cpu_quota=100000, cpu_period=100000, memory_limit_in_bytes=128 << 20)),
]


def cgroup_value(parent: str, cid: str, controller: str, name: str) -> str:
    for base in (Path("/sys/fs/cgroup") / controller, Path("/sys/fs/cgroup")):
        path = base / parent.lstrip("/") / cid / name
        if path.exists():
            return path.read_text().strip()
    return "-"


def proc_status(rt: cri_grpc.RuntimeServiceStub, cid: str) -> dict[str, str]:
    out = rt.ExecSync(cri.ExecSyncRequest(container_id=cid, cmd=["cat", "/proc/self/status"], timeout=10))
    fields = dict(line.split(":\t", 1) for line in out.stdout.decode().splitlines() if ":\t" in line)
    return {k: v.strip() for k, v in fields.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="topology-aware", help="policy for the relay (default: %(default)s)")
    ap.add_argument("--keep", action="store_true", help="leave everything running until Ctrl-C")
    args = ap.parse_args()
    # SIGTERM tears down like Ctrl-C: the private containerd and its containers go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    work = Path(tempfile.mkdtemp(prefix="crirm-demo-"))
    print(f"starting a private containerd in {work} ...", flush=True)
    ctrd = PrivateContainerd(work / "containerd").start()
    relay_sock = str(work / "cri-resmgr.sock")
    config = work / "config.yaml"
    rules = "off:.*,short:((Run)|(Create)|(Start)|(Stop)|(Remove)).*"
    config.write_text(f"policy:\n  Active: {args.policy}\ndump:\n  Config: '{rules}'\n")
    relay = subprocess.Popen([sys.executable, "-m", "resmgr", "--relay-socket", relay_sock,
                              "--runtime-socket", ctrd.socket, "--state-dir", str(work / "state"),
                              "--force-config", str(config), "--config-socket", str(work / "config.sock")])
    try:
        channel = grpc.insecure_channel("unix://" + relay_sock)
        rt = cri_grpc.RuntimeServiceStub(channel)
        started = time.monotonic()
        while True:
            try:
                version = rt.Version(cri.VersionRequest(), timeout=1, wait_for_ready=True)
                break
            except grpc.RpcError:
                if relay.poll() is not None or time.monotonic() - started > 15:
                    print("cri-resmgr did not start", file=sys.stderr)
                    return 1
        print(f"cri-resmgr serving on {relay_sock}, relaying to {version.runtime_name} "
              f"{version.runtime_version}\n", flush=True)
        started_containers = []
        for name, qos, res in SAMPLES:
            uid = f"demo-{name}"
            parent = f"/kubepods/{qos}/pod{uid}" if qos else f"/kubepods/pod{uid}"
            pod = cri.PodSandboxConfig(
                metadata=cri.PodSandboxMetadata(name=name, uid=uid, namespace="demo"),
                hostname=name, log_directory=str(work / "logs" / name),
                linux=cri.LinuxPodSandboxConfig(cgroup_parent=parent))
            pod_id = rt.RunPodSandbox(cri.RunPodSandboxRequest(config=pod), timeout=60).pod_sandbox_id
            cfg = cri.ContainerConfig(metadata=cri.ContainerMetadata(name="app"),
                                      image=cri.ImageSpec(image=BUSYBOX_IMAGE),
                                      command=["sleep", "3600"], log_path="app.log",
                                      linux=cri.LinuxContainerConfig(resources=res))
            cid = rt.CreateContainer(cri.CreateContainerRequest(
                pod_sandbox_id=pod_id, config=cfg, sandbox_config=pod), timeout=60).container_id
            rt.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=60)
            started_containers.append((name, parent, cid))
        # Read back only now: later grants move the shared containers' CPUs.
        rows = []
        for name, parent, cid in started_containers:
            status = proc_status(rt, cid)
            rows.append((name, cid[:12], status.get("Cpus_allowed_list", "?"),
                         status.get("Mems_allowed_list", "?"),
                         cgroup_value(parent, cid, "cpuset", "cpuset.cpus"),
                         cgroup_value(parent, cid, "cpuset", "cpuset.mems"),
                         cgroup_value(parent, cid, "cpu", "cpu.shares")))
        state = json.loads((work / "state" / "cache").read_text())
        qos_of = {p["name"]: p["qos_class"] for p in state["pods"]}
        print()
        header = ("pod", "container", "QoS (relay)", "Cpus_allowed", "Mems_allowed", "cpuset.cpus", "cpuset.mems",
                  "cpu.shares")
        table = [header] + [(r[0], r[1], qos_of.get(r[0], "?"), *r[2:]) for r in rows]
        widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
        for row in table:
            print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)))
        print(f"\nrelay state: {len(state['pods'])} pods, {len(state['containers'])} containers "
              f"in {work / 'state' / 'cache'}")
        if args.keep:
            print(f"\nkeeping everything up; try: CONTAINER_RUNTIME_ENDPOINT=unix://{relay_sock} "
                  "(Ctrl-C to stop)")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        for p in rt.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=10).items:
            rt.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=p.id), timeout=60)
            rt.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=p.id), timeout=60)
        channel.close()
        return 0
    finally:
        relay.terminate()
        relay.wait(15)
        ctrd.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
        os.sync()


if __name__ == "__main__":
    sys.exit(main())
