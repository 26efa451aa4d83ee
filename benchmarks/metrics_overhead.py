#!/usr/bin/env python3
"""What the HTTP endpoint costs the relay: CRI call latency direct to containerd, through a relay
without --metrics-address, through one with it, and through one with it while a scraper
fetches /metrics and /api/v1/state every second, all in the same run, plus the scrape
times themselves and the relay's CPU per call.

    python benchmarks/metrics_overhead.py [--calls 3000] [--pods 100] [--relay-mode splice]

Each relay knows --pods pods (made once, adopted by every relay at start-up), so the scraped
documents have their real size. Calls: Version and ContainerStatus (passed through), measured with 1 and 16
clients, and pod create-start-remove cycles (answered by the engine). The three relays
run one after the other against the same containerd.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test helpers, run from anywhere

from benchmarks.relay_overhead import cpu_seconds, make_pods, measure, pct, rss_mb, wait_serving  # noqa: E402
from harness.containerd import PrivateContainerd  # noqa: E402
from harness.images import BUSYBOX_IMAGE  # noqa: E402
from harness.relay import RelayProcess, free_port  # noqa: E402
from resmgr.generated.cri import api_pb2 as cri  # noqa: E402
from resmgr.generated.cri import api_pb2_grpc as cri_grpc  # noqa: E402
from resmgr.view import client  # noqa: E402


class Scraper(threading.Thread):
    """Fetches /metrics and /api/v1/state every interval, as Prometheus and the page would."""

    def __init__(self, address: str, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.address, self.interval = address, interval
        self.stop_event = threading.Event()
        self.times: dict[str, list[float]] = {"/metrics": [], "/api/v1/state": []}
        self.sizes: dict[str, int] = {}

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            for path, times in self.times.items():
                t = time.perf_counter()
                body = client.get(self.address, path, timeout=10)
                times.append(time.perf_counter() - t)
                self.sizes[path] = len(body)


def lifecycle(socket_path: str, cycles: int, logdir: str) -> list[float]:
    """Create, start, stop and remove one container in a pod, cycles times; seconds per cycle."""
    out = []
    with grpc.insecure_channel("unix://" + socket_path) as ch:
        rs = cri_grpc.RuntimeServiceStub(ch)
        for i in range(cycles):
            cfg = cri.PodSandboxConfig(
                metadata=cri.PodSandboxMetadata(name=f"cycle-{i}", uid=f"cycle-uid-{i}-{time.time_ns()}",
                                                namespace="bench"),
                log_directory=os.path.join(logdir, f"cycle-{i}"),
                linux=cri.LinuxPodSandboxConfig(
                    cgroup_parent=f"/kubepods/burstable/podcycle{i}",
                    security_context=cri.LinuxSandboxSecurityContext(
                        namespace_options=cri.NamespaceOption(network=cri.NODE))))
            t = time.perf_counter()
            pod = rs.RunPodSandbox(cri.RunPodSandboxRequest(config=cfg), timeout=60).pod_sandbox_id
            cc = cri.ContainerConfig(metadata=cri.ContainerMetadata(name="c"), image=cri.ImageSpec(image=BUSYBOX_IMAGE),
                                     command=["sleep", "3600"], log_path="c.log",
                                     linux=cri.LinuxContainerConfig(resources=cri.LinuxContainerResources(
                                         cpu_shares=102, cpu_period=100000)))
            cid = rs.CreateContainer(cri.CreateContainerRequest(pod_sandbox_id=pod, config=cc, sandbox_config=cfg),
                                     timeout=60).container_id
            rs.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=60)
            rs.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod), timeout=60)
            rs.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod), timeout=60)
            out.append(time.perf_counter() - t)
    return out


def remove_pods(socket_path: str) -> None:
    with grpc.insecure_channel("unix://" + socket_path) as ch:
        rs = cri_grpc.RuntimeServiceStub(ch)
        for p in rs.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=60).items:
            rs.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=p.id), timeout=60)
            rs.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=p.id), timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=3000, help="calls per measurement (default 3000)")
    ap.add_argument("--pods", type=int, default=100, help="pods each relay knows (default 100)")
    ap.add_argument("--cycles", type=int, default=30, help="pod create-start-remove cycles (default 30)")
    ap.add_argument("--relay-mode", default="splice", choices=["splice", "grpc"])
    ap.add_argument("--rounds", type=int, default=2, help="runs of the three relays, alternating order (default 2)")
    args = ap.parse_args()

    ctrd = PrivateContainerd().start()
    work = Path(tempfile.mkdtemp(prefix="crirm-bench-"))
    config = work / "static.yaml"
    config.write_text("policy:\n  Active: static\n")
    configs = [("no endpoint", False, False), ("endpoint, not scraped", True, False),
               ("endpoint, scraped every 1 s", True, True)]
    lat: dict = {}  # (label, method, clients) -> latencies
    cpu: dict = {}  # (label, method, clients) -> CPU seconds, calls
    cycles: dict = {c[0]: [] for c in configs}
    rss: dict = {}
    scraper_stats: dict[str, list[float]] = {"/metrics": [], "/api/v1/state": []}
    sizes: dict[str, int] = {}
    try:
        # The pods are made once; each relay finds them at start-up and adopts them.
        cid = make_pods(ctrd.socket, args.pods, str(work / "logs"))
        requests = {"Version": cri.VersionRequest(version="v1").SerializeToString(),
                    "ContainerStatus": cri.ContainerStatusRequest(container_id=cid).SerializeToString()}
        direct = {(m, n): pct(asyncio.run(measure(ctrd.socket, m, raw, args.calls, n))[0], 50)
                  for m, raw in requests.items() for n in (1, 16)}
        # Forward, then backward, and so on: a drift of the machine or of containerd over the
        # run falls on every relay alike.
        for rnd in range(args.rounds):
            for label, metrics_on, scrape in (configs if rnd % 2 == 0 else configs[::-1]):
                run = work / f"{rnd}-{label.replace(' ', '-').replace(',', '')}"
                run.mkdir()
                address = f"127.0.0.1:{free_port()}"
                extra = ["--metrics-address", address] if metrics_on else []
                relay = RelayProcess(run, ctrd.socket, "--force-config", str(config), "--log-level", "WARNING",
                                     "--relay-mode", args.relay_mode, *extra).start(wait=False)
                assert relay.proc is not None
                wait_serving(relay.socket, relay.proc)
                scraper = Scraper(address) if scrape else None
                if scraper is not None:
                    scraper.start()
                for m, raw in requests.items():
                    for n in (1, 16):
                        cpu0 = cpu_seconds(relay.proc.pid)
                        got, _ = asyncio.run(measure(relay.socket, m, raw, args.calls, n))
                        used = cpu_seconds(relay.proc.pid) - cpu0
                        lat.setdefault((label, m, n), []).extend(got)
                        c = cpu.setdefault((label, m, n), [0.0, 0])
                        c[0] += used
                        c[1] += len(got) + 50
                cycles[label] += lifecycle(relay.socket, args.cycles, str(run / "logs"))
                rss[label] = rss_mb(relay.proc.pid)
                if scraper is not None:
                    scraper.stop_event.set()
                    scraper.join()
                    for path, times in scraper.times.items():
                        scraper_stats[path] += times
                    sizes.update(scraper.sizes)
                relay.stop()
        remove_pods(ctrd.socket)
    finally:
        ctrd.stop()

    print(f"relay front end: {args.relay_mode}; static policy; {args.pods} pods known to each relay; "
          f"{args.calls} calls per figure and round, {args.rounds} rounds")
    print()
    header = f"{'relay':<30}{'method':<16}{'clients':>7} | {'p50':>7}{'p99':>8} | {'overhead p50':>12} | " \
             f"{'cpu/call':>8}"
    print(header)
    print("-" * len(header))
    for m in requests:
        for n in (1, 16):
            print(f"{'(direct to containerd)':<30}{m:<16}{n:>7} | {direct[(m, n)]:>5.0f}us{'':>8} |")
            for label, _, _ in configs:
                got = lat[(label, m, n)]
                used, count = cpu[(label, m, n)]
                print(f"{label:<30}{m:<16}{n:>7} | {pct(got, 50):>5.0f}us{pct(got, 99):>6.0f}us | "
                      f"{pct(got, 50) - direct[(m, n)]:>10.0f}us | {used / count * 1e6:>6.0f}us")
    print()
    for label, _, _ in configs:
        print(f"{label:<30} pod run+create+start+stop+remove: p50 {pct(cycles[label], 50) / 1000:.1f} ms, "
              f"p90 {pct(cycles[label], 90) / 1000:.1f} ms; RSS {rss[label]:.1f} MB")
    print()
    for path, times in scraper_stats.items():
        print(f"scrape {path:<15} {len(times)} scrapes: p50 {pct(times, 50) / 1000:.1f} ms, "
              f"max {max(times) * 1000:.1f} ms, {sizes.get(path, 0) / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
