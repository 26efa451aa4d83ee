#!/usr/bin/env python3
"""NodeResourceTopology under pod churn: how many writes reach the API server, and how soon the
object shows the final state once the churn stops.

A real kube-apiserver (harness/kube.py), a private containerd, cri-resmgr in front of it
(static policy), and cri-resmgr-agent with --export-topology on. Burstable pods (100m each) are
made and then removed through the relay as fast as one client can; every one changes the shared
pool's free milli-CPU, so every one changes the topology. The writes are counted from the API
server's audit log (the agent's create and update requests on noderesourcetopologies).

    python benchmarks/topology_export.py [--pods 20] [--interval 2]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test helpers, run from anywhere

from harness.containerd import PrivateContainerd  # noqa: E402
from harness.kube import ControlPlane  # noqa: E402
from resmgr.agent import resources as rs  # noqa: E402
from resmgr.generated.cri import api_pb2 as cri  # noqa: E402
from tests.support.agentenv import AGENT_USER, Env, RealCluster, wait_for  # noqa: E402
from tests.support.helpers import Cri, Pods  # noqa: E402

BURSTABLE = cri.LinuxContainerResources(cpu_shares=102, memory_limit_in_bytes=64 << 20)


def free_milli(env: Env) -> str:
    """The pools' available CPU as the NodeResourceTopology says."""
    nrt = env.cluster.topology() or {"zones": []}
    return ",".join(next((r["available"] for r in z["resources"] if r["name"] == "cpu"), "")
                    for z in nrt["zones"] if z["type"] != "Node")


class Watch(threading.Thread):
    """Reads the object every 50 ms and keeps when what it shows changed."""

    def __init__(self, env: Env) -> None:
        super().__init__(daemon=True)
        self.env, self.changes, self.done = env, [(time.time(), free_milli(env))], threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.wait(0.05):
            value = free_milli(self.env)
            if value != self.changes[-1][1]:
                self.changes.append((time.time(), value))

    def quiet_for(self, seconds: float) -> tuple[float, str]:
        """Wait until nothing changed for seconds; when the last change was seen, and what it showed."""
        while time.time() - self.changes[-1][0] < seconds:
            time.sleep(0.1)
        return self.changes[-1]


def writes(env: Env, start: float, end: float) -> tuple[int, int]:
    """The agent's create and update requests on noderesourcetopologies between start and end, and
    all its requests there (reads included)."""
    n = requests = 0
    for c in env.cluster.control.audit(AGENT_USER):
        at = datetime.datetime.fromisoformat(c["requestReceivedTimestamp"]).timestamp()
        if f"/{rs.NRT_PLURAL}" in c["requestURI"] and start <= at <= end and c["verb"] != "watch":
            requests += 1
            n += c["verb"] in ("create", "update", "patch")
    return n, requests


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=20, help="burstable pods made, then removed (default: %(default)s)")
    ap.add_argument("--interval", type=float, default=2.0,
                    help="the agent's --topology-interval (default: %(default)s)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="crirm-nrt-"))
    control = ControlPlane(work / "k8s").start()
    ctrd = PrivateContainerd(work / "containerd").start()
    env = Env(work, RealCluster(control, f"node-{uuid.uuid4().hex[:6]}"))
    try:
        env.cluster.resource("default", {"policy": {"Active": "static"}})
        env.start_relay(ctrd.socket, "state", "--log-level", "WARNING")
        env.agent.start("--export-topology", "on", "--topology-interval", str(args.interval), "--log-level", "INFO")
        wait_for(lambda: env.active() == "static", 30, "the static policy")
        wait_for(lambda: free_milli(env), 30, "the first NodeResourceTopology")
        watch = Watch(env)
        idle = watch.quiet_for(args.interval * 2)[1]
        via = Cri(env.relay.socket)
        pods = Pods(via, work)
        for phase in ("made", "removed"):
            start = time.time()
            if phase == "made":
                for _ in range(args.pods):
                    pods.run("burstable", BURSTABLE)
            else:
                pods.remove_all()
            end = time.time()
            shown, final = watch.quiet_for(args.interval * 3)
            n, requests = writes(env, start, shown + 0.5)
            print(f"{args.pods} pods {phase} in {end - start:.1f} s: {n} NodeResourceTopology writes in "
                  f"{requests} requests (the "
                  f"interval allows {int((shown - start) / args.interval) + 1}); its final state shown "
                  f"{max(0.0, shown - end):.2f} s after the last call; pools' free CPU {final}"
                  + (" (as before the pods)" if phase == "removed" and final == idle else ""))
        watch.done.set()
        via.close()
    finally:
        env.close()
        ctrd.stop()
        control.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
