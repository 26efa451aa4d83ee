"""Runs the simulated node over seeds (harness/sim/node.py):

    python -m harness.sim [--seeds N] [--first S | --only S,S,...] [--steps M] [--crashes K] [--switches W]
                          [--mode relay|nri] [--jobs J]

Each seed is one run of kubelet's M actions with cri-resmgr SIGKILLed K times (one of them leaving
its state file cut short) and, with --switches, configurations of other policies pushed W times
(a switch re-allocates every container); a run that breaks an invariant prints its seed, the violation and the
last lines of its trace, and the exit status is 1. --plant NAME runs them with an earlier fix of
the engine undone (harness/sim/plants.py), to show which seed finds it. --mode nri runs cri-resmgr
as containerd's NRI plugin (harness/sim/nri.py) instead of the relay in front of it.
The same seed runs the same steps (with PYTHONHASHSEED fixed: this program sets it and runs again);
--trace prints every seed's whole trace. Seeds run in J processes at once (default: one a CPU).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time
from typing import Any


def run_seed(seed: int, steps: int, crashes: int, freezes: int = 1, restarts: int = 1, plant: str = "",
             losses: int = 1, switches: int = 0, mode: str = "relay") -> tuple[int, str, list[str], float]:
    """One seed: (seed, the violation or "", its trace, virtual seconds simulated), with the named
    defect planted in the engine (harness/sim/plants.py), if any."""
    from harness.sim.node import Node, Violation
    from harness.sim.plants import planted

    node = Node(seed, steps=steps, crashes=crashes, freezes=freezes, restarts=restarts, losses=losses,
                switches=switches, mode=mode)
    with planted(plant):
        try:
            node.run()
        except Violation as err:
            return seed, str(err), node.trace, node.simulated
    return seed, "", node.trace, node.simulated


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":  # sets and dicts of strings iterate in one order
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "harness.sim", *(argv or sys.argv[1:])])
    ap = argparse.ArgumentParser(prog="python -m harness.sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20, help="how many seeds (default: %(default)s)")
    ap.add_argument("--first", type=int, default=1, help="the first seed (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=200, help="kubelet's actions a run (default: %(default)s)")
    ap.add_argument("--crashes", type=int, default=3, help="SIGKILLs of cri-resmgr a run (default: %(default)s)")
    ap.add_argument("--freezes", type=int, default=1, help="containerd frozen 5-60 s, times a run (default: 1)")
    ap.add_argument("--restarts", type=int, default=1, help="containerd restarted, times a run (default: %(default)s)")
    ap.add_argument("--losses", type=int, default=1,
                    help="of the SIGKILLs, those that leave the state file cut short (default: %(default)s)")
    ap.add_argument("--switches", type=int, default=0,
                    help="configurations of another policy pushed a run: topology-aware, static, balloons, podpools "
                         "(default: %(default)s)")
    ap.add_argument("--plant", default="", metavar="NAME",
                    help="run with an earlier fix undone (harness/sim/plants.py), to see which seed finds it")
    ap.add_argument("--only", default="", metavar="S,S,...", help="these seeds instead of --seeds and --first")
    ap.add_argument("--mode", choices=("relay", "nri"), default="relay",
                    help="cri-resmgr as the relay in front of containerd, or as its NRI plugin (default: relay)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes at once (default: one a CPU)")
    ap.add_argument("--trace", action="store_true", help="print every seed's trace")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.only.split(",") if s] or list(range(args.first, args.first + args.seeds))
    failed, simulated, began = 0, 0.0, time.monotonic()
    for seed, violation, trace, seconds in _runs(seeds, args):
        if args.trace:
            print(f"seed {seed}:")
            print("\n".join("    " + line for line in trace))
        if violation:
            failed += 1
            print(f"seed {seed}: {violation}")
            print("\n".join("    " + line for line in trace[-15:]))
        simulated += seconds
    took = time.monotonic() - began
    print(f"{len(seeds)} seeds, {failed} failed; {simulated / 60:.0f} node-minutes simulated in {took:.1f} s "
          f"({simulated / 60 / max(took / 60, 1e-9):.0f} node-minutes a minute)")
    return 1 if failed else 0


def _runs(seeds: list[int], args: Any) -> list[tuple[int, str, list[str], float]]:
    """Every seed's run, in the order of seeds (each deterministic wherever it runs)."""
    if args.jobs <= 1 or len(seeds) <= 1:
        return [run_seed(seed, args.steps, args.crashes, args.freezes, args.restarts, args.plant, args.losses,
                         args.switches, args.mode) for seed in seeds]
    n = len(seeds)
    with concurrent.futures.ProcessPoolExecutor(min(args.jobs, n)) as pool:
        return list(pool.map(run_seed, seeds, [args.steps] * n, [args.crashes] * n, [args.freezes] * n,
                             [args.restarts] * n, [args.plant] * n, [args.losses] * n, [args.switches] * n,
                             [args.mode] * n))


if __name__ == "__main__":
    sys.exit(main())
