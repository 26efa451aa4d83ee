#!/usr/bin/env python3
"""How long kubelet waits for cri-resmgr's DRA driver: NodePrepareResources and
NodeUnprepareResources over the real unix sockets, through the real engine (topology-aware on a
generated machine, or the policy named) with its state written and fsynced before each answer, and
the CDI spec written.

The claim is read from an in-process stand-in for the node agent, so the figures are cri-resmgr's
own; with the agent the read adds one more local gRPC call and one GET from the API server. The
baseline is the registration service's GetInfo on the same kind of socket: what gRPC alone costs.

    .venv/bin/python benchmarks/dra_prepare.py [--claims 200] [--machine sockets=2,nodes=2,cores=8,threads=2]
        [--policy static --dra-devices cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resmgr import policies  # noqa: E402
from resmgr.engine import Engine  # noqa: E402
from resmgr.engine.store import StateStore  # noqa: E402
from resmgr.frontends.cri.runtime import CriRuntime  # noqa: E402
from resmgr.frontends.dra.plugin import DraPlugin  # noqa: E402
from resmgr.generated.dra import api_pb2 as dra  # noqa: E402
from resmgr.generated.dra import api_pb2_grpc as dra_grpc  # noqa: E402
from resmgr.generated.pluginregistration import api_pb2 as reg  # noqa: E402
from resmgr.generated.pluginregistration import api_pb2_grpc as reg_grpc  # noqa: E402
from resmgr.topology.generate import generate, parse_spec  # noqa: E402
from resmgr.topology.sysfs import discover  # noqa: E402
from tests.support.fakeruntime import FakeRuntime  # noqa: E402

DRIVER = "cpu.cri-resource-manager.intel.com"


def claim_doc(uid: str, device: str) -> dict:
    return {"metadata": {"namespace": "bench", "name": uid, "uid": uid},
            "status": {"allocation": {"devices": {"results": [
                {"request": "cpus", "driver": DRIVER, "pool": "node", "device": device,
                 "consumedCapacity": {"cpu": "1"}}]}}}}


def figures(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"{name:<34} n={len(ms):<5} p50 {statistics.median(ms):7.2f} ms   p99 {p99:7.2f} ms   max {ms[-1]:7.2f} ms"


async def run(args: argparse.Namespace, root: Path) -> None:
    topology = discover(generate(parse_spec(args.machine), root / "host"))
    store = StateStore(root / "state")
    store.prepare()
    config: dict = {"Active": args.policy}
    if args.dra_devices:
        config[args.policy] = {"DRADevices": args.dra_devices}
    engine = Engine(policies.create(args.policy, config, topology), store, CriRuntime(FakeRuntime()))
    devices = [d["name"] for d in engine.state.policy.devices()]
    docs: dict[str, dict] = {}

    async def fetch(namespace: str, name: str) -> dict:
        return docs[name]
    plugin = DraPlugin(DRIVER, str(root / "kubelet"), str(root / "cdi"), engine, fetch)
    await plugin.start()
    try:
        async with grpc.aio.insecure_channel("unix://" + plugin.endpoint) as node, \
                grpc.aio.insecure_channel("unix://" + plugin.registry_socket) as registry:
            stub, info = dra_grpc.DRAPluginStub(node), reg_grpc.RegistrationStub(registry)
            base, prep, unprep = [], [], []
            for _ in range(args.claims):
                t = time.perf_counter()
                await info.GetInfo(reg.InfoRequest())
                base.append(time.perf_counter() - t)
            # Prepared and unprepared in turn, so the device always has room; rounds of one claim at a time.
            for i in range(args.claims):
                uid = f"claim-{i}"
                docs[uid] = claim_doc(uid, devices[i % len(devices)])
                asked = [dra.Claim(namespace="bench", uid=uid, name=uid)]
                t = time.perf_counter()
                answer = await stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=asked))
                prep.append(time.perf_counter() - t)
                assert not answer.claims[uid].error, answer.claims[uid].error
                t = time.perf_counter()
                await stub.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=asked))
                unprep.append(time.perf_counter() - t)
            # kubelet preparing many pods' claims at once: 16 calls in flight.
            burst: list[float] = []

            async def one(i: int) -> None:
                uid = f"burst-{i}"
                docs[uid] = claim_doc(uid, devices[i % len(devices)])
                t = time.perf_counter()
                answer = await stub.NodePrepareResources(dra.NodePrepareResourcesRequest(
                    claims=[dra.Claim(namespace="bench", uid=uid, name=uid)]))
                burst.append(time.perf_counter() - t)
                assert not answer.claims[uid].error, answer.claims[uid].error
            started = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(16)))
            wall = time.perf_counter() - started
    finally:
        await plugin.stop()
    shown = ", ".join(devices[:6]) + (f", ... ({len(devices)})" if len(devices) > 6 else "")
    print(f"machine {args.machine}: {len(topology.cpus)} CPUs, {args.policy}, devices {shown}")
    print(figures("GetInfo (gRPC alone)", base))
    print(figures("NodePrepareResources, 1 claim", prep))
    print(figures("NodeUnprepareResources, 1 claim", unprep))
    print(figures("NodePrepareResources, 16 at once", burst) + f"   all in {wall * 1000:.1f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--claims", type=int, default=200)
    ap.add_argument("--machine", default="sockets=2,nodes=2,cores=8,threads=2")
    ap.add_argument("--policy", default="topology-aware", help="the policy offering the devices")
    ap.add_argument("--dra-devices", default="", help="static's and static-plus' DRADevices: numa, core or cpu")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="crirm-dra-"))
    try:
        asyncio.run(run(args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
