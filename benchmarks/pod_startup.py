#!/usr/bin/env python3
"""Pod start-up: 20 pods with one container each, started in parallel, directly and through
cri-resmgr (topology-aware and static policies), against the private containerd.

Two workloads:
- best-effort: every pod is BestEffort;
- mixed: BestEffort, Burstable and Guaranteed pods, the Guaranteed ones whole CPUs, started in
  the middle of the batch so that each exclusive grant re-pins the shared containers running.

Each (workload, policy) runs --rounds batches through the relay alternating with direct ones
(pods removed in between); prints the median wall time, p50/p99 per call (RunPodSandbox,
CreateContainer, StartContainer) and the relay's wall time relative to direct. Target: within
5% of direct for both workloads.

    python benchmarks/pod_startup.py [--pods 20] [--rounds 3] [--policies topology-aware,static]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test helpers, run from anywhere

from harness.containerd import PrivateContainerd  # noqa: E402
from harness.relay import policy_relay  # noqa: E402
from resmgr.generated.cri import api_pb2 as cri  # noqa: E402
from resmgr.generated.cri import api_pb2_grpc as cri_grpc  # noqa: E402
from tests.support.helpers import GUARANTEED_CPU, ONLINE, SHARED, container_config, pod_config  # noqa: E402

CALLS = ("RunPodSandbox", "CreateContainer", "StartContainer")


def resources(qos: str) -> cri.LinuxContainerResources:
    if qos == "guaranteed":
        return GUARANTEED_CPU
    if qos == "burstable":
        return cri.LinuxContainerResources(cpu_shares=51, memory_limit_in_bytes=128 << 20)  # 50m
    return SHARED


def workload(name: str, pods: int) -> list[str]:
    """QoS class of each pod, in start order."""
    if name == "best-effort":
        return ["besteffort"] * pods
    exclusive = max(1, min(4, len(ONLINE) - 1))  # whole CPUs that fit beside a shared one
    shared = ["burstable" if i % 2 else "besteffort" for i in range(pods - exclusive)]
    middle = len(shared) // 2
    return shared[:middle] + ["guaranteed"] * exclusive + shared[middle:]


class Batch:
    def __init__(self, socket: str, logdir: str) -> None:
        self.channel = grpc.insecure_channel("unix://" + socket)
        self.rt = cri_grpc.RuntimeServiceStub(self.channel)
        self.logdir = logdir
        self.times: dict[str, list[float]] = {c: [] for c in CALLS}
        self.lock = threading.Lock()

    def _timed(self, name: str, fn, req):
        t = time.perf_counter()
        resp = fn(req, timeout=120)
        with self.lock:
            self.times[name].append(time.perf_counter() - t)
        return resp

    def start_pod(self, qos: str, delay: float) -> str:
        time.sleep(delay)
        cfg = pod_config(namespace="bench", qos=qos, logdir=self.logdir)
        pod = self._timed("RunPodSandbox", self.rt.RunPodSandbox, cri.RunPodSandboxRequest(config=cfg)).pod_sandbox_id
        cc = container_config(resources=resources(qos))
        cid = self._timed("CreateContainer", self.rt.CreateContainer,
                          cri.CreateContainerRequest(pod_sandbox_id=pod, config=cc, sandbox_config=cfg)).container_id
        self._timed("StartContainer", self.rt.StartContainer, cri.StartContainerRequest(container_id=cid))
        return pod

    def run(self, classes: list[str]) -> tuple[float, list[str]]:
        # Pods arrive 5 ms apart, as kubelet's pod workers would pick them up, all in flight at once.
        with futures.ThreadPoolExecutor(len(classes)) as pool:
            t = time.perf_counter()
            pods = list(pool.map(lambda a: self.start_pod(*a), [(q, i * 0.005) for i, q in enumerate(classes)]))
            return time.perf_counter() - t, pods

    def remove(self, pods: list[str]) -> None:
        for pod in pods:
            self.rt.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod), timeout=60)
            self.rt.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod), timeout=60)

    def close(self) -> None:
        self.channel.close()


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] * 1000


class Relay:
    """cri-resmgr with one policy, up only for its own batches: a relay running during a direct
    batch would adopt and re-pin those pods, loading the runtime the baseline is measured on."""

    def __init__(self, runtime: str, work: Path, policy: str) -> None:
        self.process = policy_relay(work, runtime, policy, "--config-socket", "disabled", "--log-level", "WARNING",
                                    "--dump", "off:.*", relay_dir=work / f"state-{policy}")

    def __enter__(self) -> str:
        return self.process.start().socket

    def __exit__(self, *exc: object) -> None:
        self.process.stop(timeout=30)


def measure(runtime: str, relay: Relay, classes: list[str], rounds: int, logdir: str
            ) -> dict[str, tuple[float, dict[str, list[float]]]]:
    """Direct and relay batches alternating, round after round (so drift hits both alike); per
    target the median wall time and every call's latency."""
    walls: dict[str, list[float]] = {"direct": [], "relay": []}
    times: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for target in ("direct", "relay"):
            with contextlib.ExitStack() as stack:
                sock = stack.enter_context(relay) if target == "relay" else runtime
                batch = Batch(sock, logdir)
                try:
                    wall, pods = batch.run(classes)
                    batch.remove(pods)
                finally:
                    batch.close()
            walls[target].append(wall)
            for call, values in batch.times.items():
                times.setdefault(target, {}).setdefault(call, []).extend(values)
    return {t: (statistics.median(walls[t]), times[t]) for t in walls}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=20, help="pods per batch (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="batches per measurement (default: %(default)s)")
    ap.add_argument("--policies", default="topology-aware,static", help="relay policies (default: %(default)s)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="crirm-podstart-"))
    ctrd = PrivateContainerd(work / "containerd").start()
    try:
        print(f"{args.pods} pods with one container each, started in parallel; median of {args.rounds} batches; "
              f"{len(ONLINE)} CPUs")
        header = (f"{'workload':<12}{'target':<22} | {'wall':>7} {'vs direct':>9} | "
                  + " | ".join(f"{c + ' p50':>19}{'p99':>7}" for c in CALLS))
        print(header)
        print("-" * len(header))
        for name in ("best-effort", "mixed"):
            classes = workload(name, args.pods)
            warm = Batch(ctrd.socket, str(work / "logs"))  # warm up: images, cgroups, CNI
            warm.remove(warm.run(classes)[1])
            warm.close()
            rows = []
            for policy in args.policies.split(","):
                got = measure(ctrd.socket, Relay(ctrd.socket, work, policy), classes, args.rounds,
                              str(work / "logs"))
                rows.append(("direct", *got["direct"], None))
                rows.append((f"relay {policy}", *got["relay"], got["direct"][0]))
            for target, wall, times, base in rows:
                rel = f"{(wall / base - 1) * 100:+8.1f}%" if base else f"{'':>9}"
                cols = " | ".join(f"{pct(times[c], 50):>17.1f}ms{pct(times[c], 99):>5.0f}ms" for c in CALLS)
                print(f"{name:<12}{target:<22} | {wall * 1000:>5.0f}ms {rel} | {cols}", flush=True)
        return 0
    finally:
        ctrd.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
