#!/usr/bin/env python3
"""cri-resmgr's NRI plugin and nri-plugins' topology-aware plugin, one after the other on the same
private containerd, the same topology-aware configuration (750m reserved) and the same load:
rounds of pods made and removed through CRI, a quarter of them Guaranteed (50m, the others 10m:
a 2-CPU machine has no whole CPU to give exclusively beside 750m reserved, and 30 pods must fit
its shared CPU).

For each plugin: the time from exec to its first synchronization with containerd (ours: the
answer sent; nri-plugins': its log of the start of it; the median of --starts starts, one machine's
start varies by tens of milliseconds), its RSS at rest (a few seconds after
that) and after the rounds, the CPU time it spent per container, and the CRI CreateContainer
latency kubelet would see. containerd alone is the baseline for the latency.

nri-plugins is not on the Go module proxy: build its plugin from a checkout (its dependencies are
on the proxy) and name the binary, e.g.

    git -C nri-plugins archive v0.14.0 | tar -x -C /tmp/nrip
    (cd /tmp/nrip && go build -o ~/.cache/cri-resmgr/bin/nri-plugins-topology-aware ./cmd/plugins/topology-aware)
    .venv/bin/python benchmarks/side_by_side.py --nri-plugins ~/.cache/cri-resmgr/bin/nri-plugins-topology-aware

Without --nri-plugins only cri-resmgr is measured.

    .venv/bin/python benchmarks/side_by_side.py [--nri-plugins BIN] [--rounds 6] [--pods 30] [--starts 9]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.relay_overhead import as_shipped, cpu_seconds, rss_mb  # noqa: E402
from harness.containerd import PrivateContainerd  # noqa: E402
from resmgr.generated.cri import api_pb2 as cri  # noqa: E402
from resmgr.requests import milli_to_shares  # noqa: E402
from tests.support.helpers import Cri, container_config, pod_config  # noqa: E402

OURS = "policy:\n  Active: topology-aware\n  ReservedResources:\n    cpu: 750m\n"
THEIRS = """apiVersion: config.nri/v1alpha1
kind: TopologyAwarePolicy
metadata:
  name: default
spec:
  pinCPU: true
  pinMemory: true
  reservedResources:
    cpu: 750m
"""


@dataclass
class Figures:
    name: str
    ready: float = 0.0  # seconds from exec to the first synchronization
    rest: float = 0.0  # MB
    after: float = 0.0  # MB
    cpu_ms: float = 0.0  # per container
    create: list[float] = field(default_factory=list)  # CreateContainer, ms


class Plugin:
    """A plugin process on the NRI socket, ready once its log says it synchronized."""

    def __init__(self, name: str, args: list[str], log: Path, ready: str) -> None:
        self.name, self.args, self.log, self.ready = name, args, log, ready
        self.proc: subprocess.Popen | None = None

    def start(self) -> float:
        started = time.perf_counter()
        self.proc = subprocess.Popen(self.args, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        while self.ready not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log.read_text()[-3000:]}")
            if time.perf_counter() - started > 60:
                raise RuntimeError(f"{self.name} not synchronized in 60 s:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.005)
        return time.perf_counter() - started

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def load(client: Cri, work: Path, pods: int) -> list[float]:
    """One round: pods made (a quarter Guaranteed), their containers started, then
    every pod removed. The CreateContainer latencies, in ms."""
    times, made = [], []
    for i in range(pods):
        guaranteed = i % 4 == 0
        cfg = pod_config(qos="guaranteed" if guaranteed else "burstable", logdir=str(work / "logs"))
        pod = client.run_pod(cfg)
        made.append(pod)
        milli = 50 if guaranteed else 10
        res = cri.LinuxContainerResources(cpu_shares=milli_to_shares(milli), cpu_period=100000,
                                          cpu_quota=milli * 100 if guaranteed else 0,
                                          memory_limit_in_bytes=64 << 20 if guaranteed else 0)
        started = time.perf_counter()
        cid = client.create(pod, cfg, container_config(resources=res))
        times.append((time.perf_counter() - started) * 1000)
        client.start(cid)
    for pod in made:
        client.remove_pod(pod)
    return times


def measure(plugin: Plugin | None, client: Cri, work: Path, rounds: int, pods: int, settle: float,
            starts: int = 1) -> Figures:
    figures = Figures(plugin.name if plugin else "containerd alone")
    if plugin is None:
        for _ in range(rounds):
            figures.create += load(client, work, pods)
        return figures
    readies = []
    for _ in range(starts - 1):  # started and stopped: only the time to ready is kept
        readies.append(plugin.start())
        plugin.stop()
    readies.append(plugin.start())
    figures.ready = statistics.median(readies)
    try:
        assert plugin.proc is not None
        pid = plugin.proc.pid
        time.sleep(settle)
        figures.rest = rss_mb(pid)
        before = cpu_seconds(pid)
        for _ in range(rounds):
            figures.create += load(client, work, pods)
        figures.cpu_ms = (cpu_seconds(pid) - before) * 1000 / (rounds * pods)
        time.sleep(settle)
        figures.after = rss_mb(pid)
    finally:
        plugin.stop()
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nri-plugins", metavar="BIN", help="nri-plugins' topology-aware plugin, built from a checkout")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--pods", type=int, default=30, help="pods per round (default: %(default)s)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds at rest before RSS is read")
    ap.add_argument("--starts", type=int, default=9, help="starts of each plugin timed (default: %(default)s)")
    args = ap.parse_args()
    as_shipped()
    work = Path(tempfile.mkdtemp(prefix="crirm-side-"))
    ctrd = PrivateContainerd(work / "ctrd").start()
    sock = str(ctrd.dir / "nri.sock")
    (work / "ours.yaml").write_text(OURS)
    (work / "theirs.yaml").write_text(THEIRS)
    plugins = [Plugin("cri-resmgr (NRI)", [
        sys.executable, "-m", "resmgr", "--nri", "--nri-socket", sock, "--force-config", str(work / "ours.yaml"),
        "--state-dir", str(work / "ours-state"), "--config-socket", str(work / "config.sock"),
        "--hook-dir", "disabled", "--log-level", "INFO"], work / "ours.log", "NRI: synchronized")]
    shared = work / "theirs-state"
    if args.nri_plugins:
        # nri-plugins mounts a directory of its state into each container with the propagation of
        # the mount it sits on, which must be shared (as / is on a systemd host).
        shared.mkdir()
        subprocess.run(["mount", "--bind", str(shared), str(shared)], check=True)
        subprocess.run(["mount", "--make-rshared", str(shared)], check=True)
        plugins.append(Plugin("nri-plugins topology-aware", [
            args.nri_plugins, "--nri-socket", sock, "--config-file", str(work / "theirs.yaml"),
            "--state-dir", str(work / "theirs-state"), "--pid-file", str(work / "theirs.pid")],
            work / "theirs.log", "synchronizing cache state"))
    client = Cri(ctrd.socket)
    try:
        rows = [measure(None, client, work, args.rounds, args.pods, args.settle)]
        rows += [measure(p, client, work, args.rounds, args.pods, args.settle, args.starts) for p in plugins]
    finally:
        client.close()
        ctrd.stop()
        if args.nri_plugins:
            subprocess.run(["umount", "-l", str(shared)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    version = ".".join(map(str, ctrd.version))
    print(f"containerd {version}, {args.rounds} rounds of {args.pods} pods (a quarter Guaranteed), "
          "topology-aware, 750m reserved")
    print(f"{'':28} {'ready':>8} {'RSS rest':>9} {'RSS after':>10} {'CPU/ctr':>9} {'create p50':>11} {'p99':>8}")
    for f in rows:
        times = sorted(f.create)
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
        ready = f"{f.ready:7.2f}s" if f.ready else f"{'':8}"
        rest = f"{f.rest:6.1f} MB" if f.rest else f"{'':9}"
        after = f"{f.after:7.1f} MB" if f.after else f"{'':10}"
        cpu = f"{f.cpu_ms:6.2f} ms" if f.ready else f"{'':9}"
        print(f"{f.name:28} {ready} {rest} {after} {cpu} {statistics.median(times):8.2f} ms {p99:5.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
