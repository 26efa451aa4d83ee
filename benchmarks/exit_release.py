#!/usr/bin/env python3
"""Exit to CPU returned: how long after a Guaranteed container exits the shared containers get
its exclusive CPU back, with container events (the default) and by reconciliation alone.

Static policy, private containerd: a BestEffort container runs on the shared CPUs, a Guaranteed
1-CPU container runs `sleep 1` and exits. The exit time is the runtime's own (ContainerStatus
finished_at); the shared container's cgroup cpuset.cpus is polled every millisecond. Needs 2 or
more CPUs.

    python benchmarks/exit_release.py [--trials 5] [--reconcile-interval 10s]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test helpers, run from anywhere

from harness.containerd import PrivateContainerd  # noqa: E402
from harness.relay import policy_relay  # noqa: E402
from resmgr.generated.cri import api_pb2 as cri  # noqa: E402
from tests.support.helpers import GUARANTEED_CPU, ONLINE, SHARED, Cri, Pods, cgroup_cpus, wait_until  # noqa: E402


def trial(via: Cri, work: Path) -> float:
    """Seconds from the Guaranteed container's exit to the shared container having every CPU."""
    pods = Pods(via, work)
    try:
        s_cfg, _, shared = pods.run("besteffort", SHARED)
        _, _, guaranteed = pods.run("guaranteed", GUARANTEED_CPU, command=["sh", "-c", "sleep 1"])
        assert cgroup_cpus(s_cfg, shared) != ONLINE, "the Guaranteed container got no exclusive CPU"
        wait_until(lambda: cgroup_cpus(s_cfg, shared) == ONLINE, timeout=120, interval=0.001)
        back = time.time_ns()
        status = via.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=guaranteed), timeout=10).status
        return (back - status.finished_at) / 1e9
    finally:
        pods.remove_all()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5, help="exits measured with events (default: %(default)s)")
    ap.add_argument("--reconcile-interval", default="10s", help="the relay's (default: %(default)s)")
    args = ap.parse_args()
    if len(ONLINE) < 2:
        print("needs 2 or more CPUs")
        return 1
    work = Path(tempfile.mkdtemp(prefix="crirm-exit-"))
    ctrd = PrivateContainerd(work / "containerd").start()
    try:
        for events, trials in (("on", args.trials), ("off", max(2, args.trials // 2))):
            relay = policy_relay(work, ctrd.socket, "static", "--config-socket", "disabled", "--log-level", "WARNING",
                                 "--reconcile-interval", args.reconcile_interval, "--runtime-events", events,
                                 relay_dir=work / f"state-{events}").start()
            via = Cri(relay.socket)
            try:
                got = [trial(via, work) for _ in range(trials)]
            finally:
                via.close()
                relay.stop(timeout=30)
            print(f"events {events:<3} (reconcile every {args.reconcile_interval}): exit -> CPU back "
                  f"p50 {statistics.median(got) * 1000:.0f} ms, max {max(got) * 1000:.0f} ms over {trials} exits",
                  flush=True)
        return 0
    finally:
        ctrd.stop()


if __name__ == "__main__":
    sys.exit(main())
