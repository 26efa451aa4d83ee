#!/usr/bin/env python3
"""NRI mode: per-event latency at the plugin, and Synchronize with many containers.

1. Synchronize: on a generated 2-socket, 224-CPU machine, the plugin (with its
   transport, over a real socket pair, the test playing the runtime) answers a
   Synchronize of N containers in N/2 pods, a quarter of them exclusive: once with
   an empty state (everything adopted and allocated), once more as after a plugin
   restart (grants restored from the state file). The time is from the request's
   first byte written to the whole answer read.
2. CreateContainer against the real containerd (the private test harness): the
   plugin's own answer time for CreateContainer (its log), and kubelet's view, the
   CRI CreateContainer call, with and without the plugin, measured in the same run.

    python benchmarks/nri.py [--containers 500] [--creates 60] [--skip-containerd]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resmgr import policies  # noqa: E402
from resmgr.engine import Engine  # noqa: E402
from resmgr.engine.store import StateStore  # noqa: E402
from resmgr.frontends.nri.plugin import NriPlugin  # noqa: E402
from resmgr.frontends.nri.runtime import NriRuntime  # noqa: E402
from resmgr.frontends.nri.transport import Trunk  # noqa: E402
from resmgr.generated.nri import api_pb2 as nri  # noqa: E402
from resmgr.generated.ttrpc import request_pb2 as ttrpc  # noqa: E402
from resmgr.requests import milli_to_shares  # noqa: E402
from resmgr.topology.generate import generate, parse_spec  # noqa: E402
from resmgr.topology.sysfs import discover  # noqa: E402

MACHINE = "sockets=2,nodes=2,cores=28,threads=2"


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def sync_request(count: int) -> nri.SynchronizeRequest:
    req = nri.SynchronizeRequest()
    for i in range(count // 2):
        guaranteed = i % 4 == 0
        qos = "" if guaranteed else "burstable/"
        pod = req.pods.add(id=f"pod{i:04d}", name=f"pod{i}", uid=f"uid{i}", namespace="bench")
        pod.linux.cgroup_parent = f"/kubepods/{qos}poduid{i}"
        for j in range(2):
            c = req.containers.add(id=f"c{i:04d}{j}", pod_sandbox_id=pod.id, name=f"app{j}",
                                   state=nri.CONTAINER_RUNNING)
            milli = 2000 if guaranteed and j == 0 else 100
            cpu = c.linux.resources.cpu
            cpu.shares.value = milli_to_shares(milli)
            cpu.period.value = 100000
            if guaranteed:
                cpu.quota.value = milli * 100
                c.linux.resources.memory.limit.value = 256 << 20
            cpu.cpus = "0-223"  # the whole machine: nothing pinned yet
    return req


async def one_sync(state_dir: Path, topology, req: nri.SynchronizeRequest) -> tuple[float, nri.SynchronizeResponse]:
    policy = policies.create("topology-aware", {"Active": "topology-aware", "ReservedResources": {"cpu": 2}},
                             topology)
    store = StateStore(state_dir)
    store.prepare()
    runtime = NriRuntime()
    engine = Engine(policy, store, runtime, gated=True, write_behind=True)  # as the daemon runs it in NRI mode
    engine.state.restore(store.load())
    plugin = NriPlugin(engine, runtime)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r1, w1 = await asyncio.open_unix_connection(sock=a)
    r2, w2 = await asyncio.open_unix_connection(sock=b)
    trunk = Trunk(r1, w1, plugin.handle)
    reading = asyncio.create_task(trunk.run())
    plugin.reset(lambda updates: asyncio.sleep(0, []))
    plugin.events = -1
    body = ttrpc.Request(service="nri.pkg.api.v1alpha1.Plugin", method="Synchronize",
                         payload=req.SerializeToString(), timeout_nano=2_000_000_000).SerializeToString()
    msg = struct.pack(">IIBB", len(body), 1, 1, 0) + body
    frames = b"".join(struct.pack(">II", 1, len(msg[i:i + 65536])) + msg[i:i + 65536]
                      for i in range(0, len(msg), 65536))
    started = time.perf_counter()
    w2.write(frames)
    buf = bytearray()
    while True:
        conn, size = struct.unpack(">II", await r2.readexactly(8))
        buf += await r2.readexactly(size)
        if len(buf) >= 10 and len(buf) >= 10 + struct.unpack(">I", buf[:4])[0]:
            break
    elapsed = time.perf_counter() - started
    resp = nri.SynchronizeResponse.FromString(ttrpc.Response.FromString(bytes(buf[10:])).payload)
    await engine.state.flush()
    trunk.close()
    w2.close()
    await asyncio.gather(reading, return_exceptions=True)
    return elapsed, resp


def report(label: str, times: list[float], resp: nri.SynchronizeResponse) -> None:
    print(f"  {label:<52} median {statistics.median(times):7.1f} ms  best {min(times):7.1f} ms  "
          f"({len(resp.update)} updates in the answer)")


def bench_sync(count: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="crirm-bench-"))
    try:
        topology = discover(generate(parse_spec(MACHINE), tmp / "machine"))
        req = sync_request(count)
        print(f"Synchronize: {len(req.pods)} pods, {len(req.containers)} containers "
              f"({len(req.SerializeToString()) // 1024} KiB) on {MACHINE} ({len(topology.cpus)} CPUs), "
              "topology-aware policy")
        state = tmp / "state"
        times, resp = [], nri.SynchronizeResponse()
        for _ in range(5):
            shutil.rmtree(state, ignore_errors=True)
            elapsed, resp = asyncio.run(one_sync(state, topology, req))
            times.append(elapsed * 1000)
        report("empty state (adopt and allocate every container)", times, resp)
        # The runtime now runs every container as answered; a restarted plugin finds its grants.
        applied = {u.container_id: u.linux.resources.cpu for u in resp.update}
        for c in req.containers:
            if c.id in applied:
                c.linux.resources.cpu.cpus, c.linux.resources.cpu.mems = applied[c.id].cpus, applied[c.id].mems
        times = []
        for _ in range(5):
            elapsed, resp = asyncio.run(one_sync(state, topology, req))
            times.append(elapsed * 1000)
        report("after a restart (grants restored from the state)", times, resp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_containerd(creates: int) -> None:
    from harness.containerd import PrivateContainerd
    from harness.relay import NriProcess
    from resmgr.generated.cri import api_pb2 as cri
    from tests.support.helpers import Cri, container_config, pod_config

    work = Path(tempfile.mkdtemp(prefix="crirm-"))
    ctrd = PrivateContainerd().start()
    try:
        client = Cri(ctrd.socket)

        def run(label: str) -> list[float]:
            times, pods = [], []
            for i in range(creates):
                cfg = pod_config(qos="guaranteed" if i % 4 == 0 else "burstable", logdir=str(work / "logs"))
                pods.append(client.run_pod(cfg))
                milli = 1000 if i % 4 == 0 else 100
                res = cri.LinuxContainerResources(cpu_shares=milli_to_shares(milli), cpu_period=100000,
                                                  cpu_quota=milli * 100 if i % 4 == 0 else 0,
                                                  memory_limit_in_bytes=64 << 20 if i % 4 == 0 else 0)
                started = time.perf_counter()
                cid = client.create(pods[-1], cfg, container_config(resources=res))
                times.append((time.perf_counter() - started) * 1000)
                client.rt.RemoveContainer(cri.RemoveContainerRequest(container_id=cid), timeout=30)
                if i % 4 == 0:  # exclusive ones are given back, so the machine never fills
                    client.remove_pod(pods.pop())
            for p in pods:
                client.remove_pod(p)
            return times

        direct = run("direct")
        config = work / "static.yaml"
        config.write_text("policy:\n  Active: static\n")
        plugin = NriProcess(work, str(ctrd.dir / "nri.sock"), "--force-config", str(config),
                            "--hook-dir", "disabled").start()
        try:
            with_plugin = run("plugin")
        finally:
            plugin.stop()
        answered = [float(m) for m in re.findall(r"NRI CreateContainer answered in ([0-9.]+) ms", plugin.log())]
        print(f"CreateContainer against containerd {'.'.join(map(str, ctrd.version))}, {creates} calls each, "
              "static policy, a quarter exclusive:")
        print(f"  at the plugin (its answer time)      p50 {pct(answered, 50):7.2f} ms  "
              f"p99 {pct(answered, 99):7.2f} ms")
        print(f"  CRI call, containerd alone          p50 {pct(direct, 50):7.2f} ms  p99 {pct(direct, 99):7.2f} ms")
        print(f"  CRI call, containerd + NRI plugin   p50 {pct(with_plugin, 50):7.2f} ms  "
              f"p99 {pct(with_plugin, 99):7.2f} ms")
        client.close()
    finally:
        ctrd.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--containers", type=int, default=500)
    ap.add_argument("--creates", type=int, default=60)
    ap.add_argument("--skip-containerd", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    bench_sync(args.containers)
    if not args.skip_containerd:
        bench_containerd(args.creates)
    return 0


if __name__ == "__main__":
    sys.exit(main())
