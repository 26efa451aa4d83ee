#!/usr/bin/env python3
"""Hours on a production-shaped node under every fault a node sees, judged from the kernel.

The VM tier's node (systemd, cgroup v2, 2 sockets x 2 NUMA nodes; harness/vm.py) with cri-resmgr
installed from the Debian package - the relay, or the NRI plugin - its agent as the package's
unit, kubelet 1.37 and the agent on the API server this program runs on the host. Pods of every
kind are made, resized and deleted all the time; the configuration changes through the cluster
every few minutes; and faults strike at random moments (harness/soak/run.py lists them). The
kernel's view of every container (harness/soak/sampler.py in the guest) is judged all along
(harness/soak/judge.py). Printed at the end: for each fault kind how often it struck and the
longest time until the node was whole again, the violations (goal: none), and the slopes of
cri-resmgr's and the agent's RSS and open file descriptors.

    python benchmarks/soak.py --duration 1h [--mode relay|nri|both] [--seed N] [--json FILE]

Shorter than 20 minutes, each fault strikes once with shorter outages (kubelet's runtime request
timeout 60 s) and the node is not rebooted unless --reboot says so: the form `scripts/test.sh --vm
--vm-soak` runs. --daemon-options "--log-level DEBUG" logs the daemon's every decision; the node's
journals are saved in the work directory.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import releases, vmimage  # noqa: E402
from harness.kube import ControlPlane  # noqa: E402
from harness.soak import config as cfg  # noqa: E402
from harness.soak.guest import AGENT_PORT, SAMPLES  # noqa: E402
from harness.soak.proxy import CountingProxy  # noqa: E402
from harness.soak.report import text  # noqa: E402
from harness.soak.run import settings_for, soak_on  # noqa: E402
from harness.vm import Shape, Vm  # noqa: E402
from harness.vmnode import API_PORT  # noqa: E402
from resmgr.options import duration  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
def build_deb(out: Path) -> Path:
    done = subprocess.run(["scripts/build-deb.sh", str(out)], cwd=ROOT, check=True, capture_output=True, text=True)
    return Path(done.stdout.strip())


def save_logs(vm: Vm, into: Path) -> None:
    """The node's journals of the units the soak judges, kept in the work directory for a post-mortem."""
    into.mkdir(exist_ok=True)
    for unit in ("cri-resmgr", "cri-resmgr-nri", "cri-resmgr-agent", "containerd", "kubelet"):
        try:  # the last 15 MB of each (the guest agent's output is capped at 16 MB)
            out = vm.run(f"journalctl -u {unit} -o short-precise --no-pager | tail -c 15000000", timeout=300)
            (into / f"{unit}.log").write_text(out.out)
        except (OSError, TimeoutError, RuntimeError) as err:
            print(f"soak: the journal of {unit}: {err}", file=sys.stderr)
    try:  # the sampler's records: what the judge read (a stream to replay through it)
        out = vm.run(f"tail -c 15000000 {SAMPLES}", timeout=300)
        (into / "samples.jsonl").write_text(out.out)
    except (OSError, TimeoutError, RuntimeError) as err:
        print(f"soak: the sampler's records: {err}", file=sys.stderr)
    print(f"soak: the node's journals and the sampler's records are in {into}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=duration, default=3600.0, metavar="DURATION",
                    help="how long each mode's soak churns (1h, 5m, 300s; default: 1h)")
    ap.add_argument("--mode", choices=["relay", "nri", "both"], default="both")
    ap.add_argument("--policy", choices=sorted(cfg.START), default="topology-aware",
                    help="the policy the node starts in; the first configuration change switches to the other "
                         "(default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of every random choice (default: a new one, printed)")
    ap.add_argument("--reboot", action=argparse.BooleanOptionalAction, default=None,
                    help="reboot the node once (default: in runs of 20 minutes or more)")
    ap.add_argument("--daemon-options", default="", metavar="OPTIONS",
                    help="more options of cri-resmgr on the node, e.g. \"--log-level DEBUG\" (default: none)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    missing = vmimage.missing_tools()
    if missing:
        print("soak: missing " + ", ".join(missing) + " (run scripts/setup.sh vm)", file=sys.stderr)
        return 2
    seed = args.seed or random.randrange(1, 1 << 31)
    work = Path(tempfile.mkdtemp(prefix="crirm-soak-"))
    control = ControlPlane(work / "k8s").start()
    proxy = CountingProxy(control.port).start()
    reports = []
    try:
        files = {"cri-resmgr.deb": build_deb(work / "deb")}
        previous = releases.previous_installed()  # the soak rolls back to it and upgrades again
        if previous is not None:
            files["cri-resmgr-previous.deb"] = releases.deb(previous)
        (work / "vm").mkdir()
        vm = Vm(vmimage.build(), Shape(), work / "vm", forwards={API_PORT: control.port, AGENT_PORT: proxy.port},
                files=files)
        vm.start()
        print(f"soak: the node booted in {vm.boot_seconds:.0f} s (work directory {work})", flush=True)
        try:
            for mode in (["relay", "nri"] if args.mode == "both" else [args.mode]):
                report = soak_on(vm, control, proxy, settings_for(args.duration, mode, seed, args.reboot,
                                                                   args.daemon_options, args.policy))
                reports.append(report)
                print(text(report), flush=True)
        finally:
            save_logs(vm, work / "logs")
            vm.stop()
    finally:
        proxy.stop()
        control.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1))
    return 1 if any(sum(r["violations"].values()) for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
