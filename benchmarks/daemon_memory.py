#!/usr/bin/env python3
"""cri-resmgr's memory and open descriptors over one long life under steady churn: the slope the
soak cannot give, since it kills the daemon twice an hour.

The daemon (relay or NRI plugin) in front of the private containerd, configured through its config
link as the agent does it. A pod is made every --every seconds (a quarter Guaranteed, the others
Burstable or BestEffort), the oldest deleted once more than --alive run; every --config-every a
policy option is pushed (it alternates, so the policy is reconfigured each time); the metrics
endpoint is scraped and the status asked every 15 s, as Prometheus and probes do. RSS and open
descriptors are sampled every 10 s. Printed: the least-squares slope of each after --warmup, per
hour, and the samples at the start, the middle and the end.

    .venv/bin/python benchmarks/daemon_memory.py --duration 1h [--mode relay|nri] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.relay_overhead import as_shipped, rss_mb  # noqa: E402
from harness.containerd import PrivateContainerd  # noqa: E402
from harness.relay import NriProcess, RelayProcess  # noqa: E402
from harness.soak.report import slope  # noqa: E402
from resmgr.options import duration  # noqa: E402
from tests.support.helpers import Cri, Link, container_config, pod_config, resources  # noqa: E402

METRICS = "127.0.0.1:18931"
SAMPLE_EVERY = 10.0
SCRAPE_EVERY = 15.0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def start(mode: str, work: Path, ctrd: PrivateContainerd) -> RelayProcess:
    extra = ("--metrics-address", METRICS, "--hook-dir", "disabled", "--log-level", "INFO")
    if mode == "nri":
        return NriProcess(work, str(ctrd.dir / "nri.sock"), *extra).start()
    return RelayProcess(work, ctrd.socket, *extra).start()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=duration, default=3600.0, help="how long (1h, 20m; default: 1h)")
    ap.add_argument("--mode", choices=("relay", "nri"), default="relay")
    ap.add_argument("--every", type=float, default=4.0, help="seconds between pods made (default: %(default)s)")
    ap.add_argument("--alive", type=int, default=8, help="pods running at most (default: %(default)s)")
    ap.add_argument("--config-every", type=duration, default=300.0, help="between configuration pushes")
    ap.add_argument("--warmup", type=duration, default=600.0, help="left out of the slope (default: 10m)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="FILE", help="the samples and slopes, as JSON")
    args = ap.parse_args()
    as_shipped()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="crirm-mem-"))
    ctrd = PrivateContainerd(work / "ctrd").start()
    daemon = start(args.mode, work, ctrd)
    assert daemon.proc is not None
    pid = daemon.proc.pid
    link = Link(str(work / "config.sock"))
    client = Cri(ctrd.socket if args.mode == "nri" else daemon.socket)
    alive: list[str] = []
    samples: list[tuple[float, int, float, float]] = []  # (t, pid, RSS MB, descriptors)
    made = pushes = refused = 0
    began = time.monotonic()
    next_pod = next_sample = next_scrape = began
    next_config = began + args.config_every
    try:
        link.push({"policy": "Active: topology-aware\nReservedResources:\n  cpu: 100m\n"})
        while (now := time.monotonic()) < began + args.duration:
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {daemon.proc.returncode}:\n{daemon.log()[-3000:]}")
            if now >= next_sample:
                samples.append((now - began, pid, rss_mb(pid), float(fds(pid))))
                next_sample += SAMPLE_EVERY
            if now >= next_scrape:
                urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=10).read()
                link.status()
                next_scrape += SCRAPE_EVERY
            if now >= next_config:
                pushes += 1
                link.push({"policy": "Active: topology-aware\nReservedResources:\n  cpu: 100m\n"
                                     f"ColocatePods: {'true' if pushes % 2 else 'false'}\n"})
                next_config += args.config_every
            if now >= next_pod:
                qos = rng.choice(("guaranteed", "burstable", "burstable", "besteffort"))
                cfg = pod_config(qos=qos, logdir=str(work / "logs"))
                pod = client.run_pod(cfg)
                res = {"guaranteed": resources(1000, True), "burstable": resources(200, False)}.get(
                    qos, resources(0, False))
                alive.append(pod)
                try:
                    client.run_container(pod, cfg, container_config(resources=res))
                    made += 1
                except grpc.RpcError:  # no exclusive CPU free: kubelet would make it again later
                    refused += 1
                if len(alive) > args.alive:
                    client.remove_pod(alive.pop(0))
                next_pod += args.every
            time.sleep(0.2)
    finally:
        for pod in alive:
            client.remove_pod(pod)
        client.close()
        link.close()
        daemon.stop()
        ctrd.stop()
        shutil.rmtree(work, ignore_errors=True)
    rss = [(t, p, v) for t, p, v, _ in samples]
    fd = [(t, p, v) for t, p, _, v in samples]
    rss_slope, used = slope(rss, args.warmup, 0.0)
    fd_slope, _ = slope(fd, args.warmup, 0.0)
    print(f"{args.mode} mode, one life of {args.duration / 60:.0f} minutes: {made} pods made ({refused} refused "
          f"for want of an exclusive CPU), at most {args.alive} running, {pushes} configuration pushes")
    print(f"  RSS: {rss_slope:+.2f} MB an hour after the first {args.warmup / 60:.0f} minutes ({used} samples); "
          f"descriptors: {fd_slope:+.2f} an hour")
    for label, (t, _, v, f) in (("start", samples[0]), ("middle", samples[len(samples) // 2]), ("end", samples[-1])):
        print(f"  {label:>6} ({t / 60:5.1f} min): RSS {v:.1f} MB, {f:.0f} descriptors")
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": args.mode, "duration_s": args.duration, "pods": made,
                                               "pushes": pushes, "rss_mb_per_h": rss_slope,
                                               "fds_per_h": fd_slope, "samples": samples}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
