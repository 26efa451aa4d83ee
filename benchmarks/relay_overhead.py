#!/usr/bin/env python3
"""Relay overhead: CRI call latency direct to containerd, through cri-resmgr, and through a
minimal Go gRPC proxy (benchmarks/goproxy, grpc-go relaying raw bytes), in the same run.

Brings up the private containerd (or uses --runtime-socket), starts the relay and the Go
proxy as separate processes, and measures Version, Status, ListContainers and
ContainerStatus with 1 and 16 concurrent clients, all three ways. The load comes from a Go
client (benchmarks/goproxy/load: each client a goroutine with a connection of its own, as
separate callers would be), so the client is not what limits the figures; --client python
uses a grpc.aio client in this process instead. Prints p50/p99 per call,
each proxy's overhead (its latency - direct), cri-resmgr's overhead as a ratio of the Go
proxy's (each figure the median of --rounds interleaved measurements), the CPU time each
proxy spends per relayed call, calls per second, the relay's
RSS with --pods pods known, and its start-up time to first served call.

Targets: p50 overhead at most 0.5x the Go proxy's with 1 client and at most 1.0x with 16;
p99 with 16 clients no worse than the Go proxy's.

    python benchmarks/relay_overhead.py [--calls 2000] [--pods 100]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.containerd import PrivateContainerd  # noqa: E402
from harness.images import BUSYBOX_IMAGE  # noqa: E402
from harness.relay import RelayProcess  # noqa: E402
from resmgr.generated.cri import api_pb2 as cri  # noqa: E402
from resmgr.generated.cri import api_pb2_grpc as cri_grpc  # noqa: E402

BASE = "/runtime.v1.RuntimeService/"
GOPROXY_SRC = Path(__file__).resolve().parent / "goproxy"
CACHE = Path(os.environ.get("CRI_RESMGR_CACHE", Path.home() / ".cache" / "cri-resmgr"))


def build_goproxy(package: str = ".") -> Path:
    """Build a command of benchmarks/goproxy (the proxy, or ./load) with the Go toolchain (module
    proxy), cached by its sources' hash."""
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go", "load/main.go", "raw/raw.go"):
        digest.update((GOPROXY_SRC / name).read_bytes())
    name = "goproxy" if package == "." else Path(package).name
    binary = CACHE / "go" / f"goproxy-{digest.hexdigest()[:12]}" / name
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        go = shutil.which("go") or "/usr/local/go/bin/go"
        subprocess.run([go, "build", "-trimpath", "-o", str(binary) + ".tmp", package], cwd=GOPROXY_SRC,
                       check=True, env=dict(os.environ, GOFLAGS="-mod=readonly", GOTOOLCHAIN="local"))
        os.replace(str(binary) + ".tmp", binary)
    return binary


def start_goproxy(runtime_socket: str, workdir: str) -> tuple[subprocess.Popen, str]:
    sock = os.path.join(workdir, "goproxy.sock")
    proc = subprocess.Popen([str(build_goproxy()), "-listen", sock, "-backend", runtime_socket])
    wait_serving(sock, proc)
    return proc, sock


def wait_serving(sock: str, proc: subprocess.Popen) -> None:
    while True:
        # A fresh channel per attempt: a channel's reconnect backoff would inflate start-up figures.
        with grpc.insecure_channel("unix://" + sock) as ch:
            try:
                cri_grpc.RuntimeServiceStub(ch).Version(cri.VersionRequest(), timeout=1)
                return
            except grpc.RpcError:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited during start-up") from None
        time.sleep(0.005)


def as_shipped() -> None:
    """Measure the daemon as the package ships it: its modules compiled to bytecode, so a start reads
    them instead of compiling them (a shell with PYTHONDONTWRITEBYTECODE would measure compilation)."""
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "resmgr")], check=True,
                   stdout=subprocess.DEVNULL)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_relay(runtime_socket: str, workdir: str, mode: str) -> tuple[subprocess.Popen, str, float]:
    started = time.perf_counter()
    relay = RelayProcess(Path(workdir), runtime_socket, "--dump", "off:.*", "--log-level", "WARNING",
                         "--relay-mode", mode).start(wait=False)
    assert relay.proc is not None
    wait_serving(relay.socket, relay.proc)  # to the first served call: that is the figure printed
    return relay.proc, relay.socket, time.perf_counter() - started


def make_pods(socket: str, count: int, logdir: str) -> str:
    """Create count host-network pods with one running container each; returns one container ID."""
    with grpc.insecure_channel("unix://" + socket) as ch:
        rs = cri_grpc.RuntimeServiceStub(ch)
        cid = ""
        for i in range(count):
            cfg = cri.PodSandboxConfig(
                metadata=cri.PodSandboxMetadata(name=f"bench-{i}", uid=f"bench-uid-{i}", namespace="bench"),
                log_directory=os.path.join(logdir, f"bench-{i}"),
                linux=cri.LinuxPodSandboxConfig(
                    cgroup_parent=f"/kubepods/besteffort/podbench-uid-{i}",
                    security_context=cri.LinuxSandboxSecurityContext(
                        namespace_options=cri.NamespaceOption(network=cri.NODE))))
            pod = rs.RunPodSandbox(cri.RunPodSandboxRequest(config=cfg), timeout=60).pod_sandbox_id
            if i < 3:  # a few real containers keep ListContainers realistic
                cc = cri.ContainerConfig(metadata=cri.ContainerMetadata(name="sleeper"),
                                         image=cri.ImageSpec(image=BUSYBOX_IMAGE),
                                         command=["sleep", "3600"], log_path="sleeper.log")
                cid = rs.CreateContainer(cri.CreateContainerRequest(
                    pod_sandbox_id=pod, config=cc, sandbox_config=cfg), timeout=60).container_id
                rs.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=60)
        return cid


async def measure(socket: str, method: str, request: bytes, calls: int, clients: int) -> tuple[list[float], float]:
    async with grpc.aio.insecure_channel("unix://" + socket) as ch:
        mc = ch.unary_unary(BASE + method)
        for _ in range(50):  # warm up
            await mc(request, timeout=10)
        latencies: list[float] = []
        per_client = max(1, calls // clients)

        async def client() -> None:
            for _ in range(per_client):
                t = time.perf_counter()
                await mc(request, timeout=10)
                latencies.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return latencies, len(latencies) / (time.perf_counter() - t0)


def measure_go(load: Path, socket: str, method: str, request: bytes, calls: int,
               clients: int) -> tuple[list[float], float]:
    out = subprocess.run([str(load), "-socket", socket, "-method", BASE + method, "-request", request.hex(),
                          "-calls", str(calls), "-clients", str(clients)], capture_output=True, text=True,
                         check=True, timeout=600)
    return [int(line) / 1e9 for line in out.stdout.split()], float(out.stderr.split()[-1])


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000, help="calls per measurement (default 2000)")
    ap.add_argument("--pods", type=int, default=100, help="pods created through the relay (default 100)")
    ap.add_argument("--runtime-socket", help="use this containerd instead of a private one")
    ap.add_argument("--relay-mode", default="splice", choices=["splice", "grpc"],
                    help="relay front end to measure (default: splice)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="measurements of each method, direct, relay and Go proxy interleaved; the figures are "
                         "their medians (default 5)")
    ap.add_argument("--client", default="go", choices=["go", "python"],
                    help="load client: go (benchmarks/goproxy/load, a connection per client) or python "
                         "(grpc.aio coroutines in this process, one channel; default: go)")
    args = ap.parse_args()
    if args.client == "go":
        load = build_goproxy("./load")

        def run(socket: str, method: str, raw: bytes, clients: int) -> tuple[list[float], float]:
            return measure_go(load, socket, method, raw, args.calls, clients)
    else:
        def run(socket: str, method: str, raw: bytes, clients: int) -> tuple[list[float], float]:
            return asyncio.run(measure(socket, method, raw, args.calls, clients))

    ctrd = None
    if args.runtime_socket:
        runtime = args.runtime_socket
    else:
        ctrd = PrivateContainerd().start()
        runtime = ctrd.socket
    work = tempfile.mkdtemp(prefix="crirm-bench-")
    relay, relay_sock, startup = start_relay(runtime, work, args.relay_mode)
    goproxy, go_sock = start_goproxy(runtime, work)
    try:
        rss_start = rss_mb(relay.pid)
        cid = make_pods(relay_sock, args.pods, os.path.join(work, "logs"))
        rss_pods = rss_mb(relay.pid)
        requests = {
            "Version": cri.VersionRequest(version="v1"),
            "Status": cri.StatusRequest(),
            "ListContainers": cri.ListContainersRequest(),
            "ContainerStatus": cri.ContainerStatusRequest(container_id=cid),
        }
        print(f"relay front end: {args.relay_mode}; baseline: benchmarks/goproxy (grpc-go, raw bytes); "
              f"load client: {args.client}")
        print(f"relay start-up to first served call: {startup * 1000:.0f} ms")
        print(f"relay RSS: {rss_start:.1f} MB at start, {rss_pods:.1f} MB with {args.pods} pods known")
        print()
        header = (f"{'method':<16}{'clients':>7} | {'direct p50':>10}{'p99':>7} | {'relay p50':>9}{'p99':>7} | "
                  f"{'go p50':>7}{'p99':>7} | {'ovh relay':>9}{'go':>6} | {'ratio p50':>9}{'p99 r/g':>8} | "
                  f"{'cpu/call relay':>14}{'go':>6} | {'relay/s':>8}{'go/s':>7}")
        print(header)
        print("-" * len(header))
        ratios: dict[int, list[float]] = {1: [], 16: []}
        p99s: list[float] = []
        for method, req in requests.items():
            raw = req.SerializeToString()
            for clients in (1, 16):
                rows = []
                for _ in range(args.rounds):  # interleaved, so a slow moment of the machine hits all three
                    d_lat, _ = run(runtime, method, raw, clients)
                    cpu0 = cpu_seconds(relay.pid)
                    r_lat, r_rate = run(relay_sock, method, raw, clients)
                    warm = 50 * clients if args.client == "go" else 50  # warm-up calls, also relayed
                    r_cpu = (cpu_seconds(relay.pid) - cpu0) / (len(r_lat) + warm) * 1e6
                    cpu0 = cpu_seconds(goproxy.pid)
                    g_lat, g_rate = run(go_sock, method, raw, clients)
                    g_cpu = (cpu_seconds(goproxy.pid) - cpu0) / (len(g_lat) + warm) * 1e6
                    d50, r50, g50 = pct(d_lat, 50), pct(r_lat, 50), pct(g_lat, 50)
                    ratio = (r50 - d50) / (g50 - d50) if g50 > d50 else float("nan")
                    rows.append((d50, pct(d_lat, 99), r50, pct(r_lat, 99), g50, pct(g_lat, 99), ratio,
                                 r_cpu, g_cpu, r_rate, g_rate))
                d50, d99, r50, r99, g50, g99, ratio, r_cpu, g_cpu, r_rate, g_rate = \
                    (statistics.median(col) for col in zip(*rows, strict=True))
                ratios[clients].append(ratio)
                if clients == 16:
                    p99s.append(r99 / g99)
                print(f"{method:<16}{clients:>7} | {d50:>8.0f}us{d99:>5.0f}us | {r50:>7.0f}us{r99:>5.0f}us | "
                      f"{g50:>5.0f}us{g99:>5.0f}us | {r50 - d50:>7.0f}us{g50 - d50:>4.0f}us | {ratio:>9.2f}"
                      f"{r99 / g99:>8.2f} | {r_cpu:>12.0f}us{g_cpu:>4.0f}us | {r_rate:>8.0f}{g_rate:>7.0f}")
        print()
        print(f"overhead ratio relay/go p50, 1 client: worst {max(ratios[1]):.2f} (target <= 0.5); "
              f"16 clients: worst {max(ratios[16]):.2f} (target <= 1.0); "
              f"p99 relay/go with 16 clients: worst {max(p99s):.2f} (target <= 1.0)")
        print()
        print(f"relay RSS after the run: {rss_mb(relay.pid):.1f} MB")
    finally:
        relay.terminate()
        relay.wait(15)
        goproxy.terminate()
        goproxy.wait(15)
        if ctrd is not None:
            ctrd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
