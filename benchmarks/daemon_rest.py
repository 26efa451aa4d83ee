#!/usr/bin/env python3
"""cri-resmgr at rest: RSS, and the time from exec to the first CRI call it serves, in relay mode
(topology-aware, the built-in configuration) in front of the private containerd, over several starts.

    .venv/bin/python benchmarks/daemon_rest.py [--starts 5] [--settle 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.relay_overhead import as_shipped, cpu_seconds, rss_mb, wait_serving  # noqa: E402
from harness.containerd import PrivateContainerd  # noqa: E402
from harness.relay import policy_relay  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=5, help="starts measured (default: %(default)s)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after the first call before RSS is read")
    args = ap.parse_args()
    as_shipped()
    work = Path(tempfile.mkdtemp(prefix="crirm-rest-"))
    ctrd = PrivateContainerd(work / "ctrd")
    ctrd.start()
    ups, rss, cpu = [], [], []
    try:
        for n in range(args.starts):
            d = work / f"start-{n}"
            d.mkdir()
            began = time.perf_counter()
            relay = policy_relay(d, ctrd.socket, "topology-aware", "--log-level", "WARNING").start(wait=False)
            assert relay.proc is not None
            wait_serving(relay.socket, relay.proc)
            ups.append(time.perf_counter() - began)
            time.sleep(args.settle)
            rss.append(rss_mb(relay.proc.pid))
            cpu.append(cpu_seconds(relay.proc.pid))
            relay.stop()
    finally:
        ctrd.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.starts} starts, relay mode, topology-aware, the private containerd:")
    print(f"  exec to first served call: median {1000 * statistics.median(ups):.0f} ms "
          f"({', '.join(f'{1000 * u:.0f}' for u in ups)})")
    print(f"  RSS at rest: median {statistics.median(rss):.1f} MB; CPU used by then: median "
          f"{statistics.median(cpu):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
