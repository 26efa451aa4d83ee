#!/usr/bin/env python3
"""Runtime hook plugin overhead: RunPodSandbox and CreateContainer latency through the relay
with 0, 1 and 3 plugins registered (each called at PreRunPodSandbox and PreCreateContainer).

Two back ends, measured in the same run:
- `stub`: a minimal CRI runtime (grpc.aio, answers at once), so the figures are the relay's
  and the plugins' own cost without the runtime's noise;
- `containerd`: the private containerd (real sandboxes and containers; --containerd-calls).

The plugins are tests/support/hookserver.py processes (the example plugin: environment, annotation,
quota cap). The relay's state directory is on tmpfs for the stub back end, so its fsync does not
drown the figures. Prints p50/p99 per call; per plugin call: the added p50 latency
((p50 with k plugins - p50 with none) / k), the CPU time the plugin process spent (its own work,
gRPC server included), the added latency beyond that, and the relay's added CPU time.
Target: under 1 ms p50 per plugin call beyond the plugin's own work.

    python benchmarks/hooks.py [--calls 300] [--containerd-calls 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.containerd import PrivateContainerd  # noqa: E402
from harness.relay import RelayProcess, wait_socket  # noqa: E402
from resmgr.generated.cri import api_pb2 as cri  # noqa: E402
from resmgr.generated.cri import api_pb2_grpc as cri_grpc  # noqa: E402
from tests.support.helpers import container_config, pod_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = "/runtime.v1.RuntimeService/"


class StubRuntime(grpc.GenericRpcHandler):
    """Just enough of a CRI runtime for the relay: version, empty listings, instant creates."""

    REPLIES = {
        "Version": lambda: cri.VersionResponse(version="0.1.0", runtime_name="containerd", runtime_version="stub",
                                               runtime_api_version="v1"),
        "ListPodSandbox": cri.ListPodSandboxResponse, "ListContainers": cri.ListContainersResponse,
        "RunPodSandbox": lambda: cri.RunPodSandboxResponse(pod_sandbox_id=uuid.uuid4().hex),
        "CreateContainer": lambda: cri.CreateContainerResponse(container_id=uuid.uuid4().hex),
        "Status": cri.StatusResponse, "StopPodSandbox": cri.StopPodSandboxResponse,
        "RemovePodSandbox": cri.RemovePodSandboxResponse,
    }

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        name = details.method.removeprefix(BASE)
        make = self.REPLIES.get(name)
        if make is None:
            return None

        async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return make().SerializeToString()

        return grpc.unary_unary_rpc_method_handler(unary)


async def serve_stub(sock: str) -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([StubRuntime()])
    server.add_insecure_port("unix://" + sock)
    await server.start()
    await server.wait_for_termination()


def start_stub(sock: str) -> subprocess.Popen:
    """The stub runtime in a process of its own, as a runtime is."""
    proc = subprocess.Popen([sys.executable, __file__, "--serve-stub", sock], cwd=ROOT)
    wait_socket(sock, proc=proc)
    return proc


def start_plugins(workdir: Path, hookdir: Path, count: int) -> list[subprocess.Popen]:
    procs = []
    for i in range(count):
        sock = str(workdir / f"plugin{i}.sock")
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.hookserver", "--socket", sock, "--name", f"p{i}"],
                                cwd=ROOT)
        wait_socket(sock, proc=proc)
        (hookdir / f"{i:02d}-plugin.json").write_text(json.dumps({
            "remote-endpoint": sock, "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer"]}))
        procs.append(proc)
    return procs


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def measure(relay: RelayProcess, calls: int, logdir: str) -> dict[str, list[float]]:
    ch = grpc.insecure_channel("unix://" + relay.socket)
    rt = cri_grpc.RuntimeServiceStub(ch)
    out: dict[str, list[float]] = {"RunPodSandbox": [], "CreateContainer": []}
    for i in range(calls + 5):
        cfg = pod_config(logdir=logdir)
        cfg.labels["example.com/cpu-cap"] = "500m"
        t0 = time.perf_counter()
        pod = rt.RunPodSandbox(cri.RunPodSandboxRequest(config=cfg), timeout=60).pod_sandbox_id
        t1 = time.perf_counter()
        rt.CreateContainer(cri.CreateContainerRequest(pod_sandbox_id=pod, config=container_config(f"c{i}"),
                                                      sandbox_config=cfg), timeout=60)
        t2 = time.perf_counter()
        if i >= 5:  # warm-up: connections, first-call costs
            out["RunPodSandbox"].append((t1 - t0) * 1000)
            out["CreateContainer"].append((t2 - t1) * 1000)
        # Removed at once, so the state stays small: its size would show in every call's save.
        rt.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod), timeout=60)
        rt.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod), timeout=60)
    ch.close()
    return out


Results = dict[int, tuple[dict[str, list[float]], float, float]]  # plugins -> latencies, relay / plugin CPU


def run(backend: str, runtime_socket: str, calls: int, counts: list[int]) -> Results:
    results = {}
    shm = "/dev/shm" if backend == "stub" and os.path.isdir("/dev/shm") else None
    for count in counts:
        with tempfile.TemporaryDirectory(prefix="crirm-bh-") as tmp, \
                tempfile.TemporaryDirectory(prefix="crirm-bh-state-", dir=shm) as state:
            workdir = Path(tmp)
            hookdir = workdir / "hookserver.d"
            hookdir.mkdir()
            plugins = start_plugins(workdir, hookdir, count)
            relay = RelayProcess(workdir, runtime_socket, "--hook-dir", str(hookdir), "--log-level", "INFO",
                                 "--runtime-events", "off", relay_dir=Path(state)).start()
            try:
                assert relay.proc is not None
                relay_cpu, plugin_cpu = cpu_seconds(relay.proc.pid), sum(cpu_seconds(p.pid) for p in plugins)
                lat = measure(relay, calls, str(workdir / "logs"))
                n = len(lat["RunPodSandbox"]) + 5  # warm-up calls included in the CPU figures
                relay_cpu = (cpu_seconds(relay.proc.pid) - relay_cpu) / n * 1000
                plugin_cpu = (sum(cpu_seconds(p.pid) for p in plugins) - plugin_cpu) / n * 1000
                results[count] = (lat, relay_cpu, plugin_cpu)
            finally:
                relay.stop()
                for p in plugins:
                    p.kill()
                    p.wait()
    return results


def report(backend: str, results: Results) -> None:
    print(f"\n{backend} back end ({len(results[0][0]['RunPodSandbox'])} calls each):")
    print(f"  {'call':16} {'plugins':>7} {'p50 ms':>8} {'p99 ms':>8}   per plugin call: added p50, plugin CPU, "
          "beyond the plugin, relay CPU")
    for call in ("RunPodSandbox", "CreateContainer"):
        base = statistics.median(results[0][0][call])
        for count, (lat, _, _) in results.items():
            values = lat[call]
            print(f"  {call:16} {count:7d} {statistics.median(values):8.3f} {pct(values, 99):8.3f}", end="")
            if count:
                # Two hook calls per pod (one per call measured): CPU figures are per pod, halve them.
                added = (statistics.median(values) - base) / count
                plugin = results[count][2] / count / 2
                relay = (results[count][1] - results[0][1]) / count / 2
                print(f"   {added:.3f} ms, {plugin:.3f} ms, {added - plugin:.3f} ms, {relay:.3f} ms", end="")
            print()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300, help="calls per measurement against the stub runtime")
    ap.add_argument("--containerd-calls", type=int, default=30, help="calls per measurement against containerd "
                    "(0: skip)")
    ap.add_argument("--serve-stub", metavar="SOCKET", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_stub:
        asyncio.run(serve_stub(args.serve_stub))
        return 0
    counts = [0, 1, 3]
    print(f"hook plugin overhead, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="crirm-bs-") as tmp:
        stub = start_stub(os.path.join(tmp, "stub.sock"))
        try:
            report("stub", run("stub", os.path.join(tmp, "stub.sock"), args.calls, counts))
        finally:
            stub.kill()
            stub.wait()
    if args.containerd_calls > 0:
        ctrd = PrivateContainerd().start()
        try:
            report("containerd", run("containerd", ctrd.socket, args.containerd_calls, counts))
        finally:
            ctrd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
