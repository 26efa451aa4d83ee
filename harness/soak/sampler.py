#!/usr/bin/python3
"""The soak's eyes on the node (run inside the guest by systemd, with the guest's own Python and
nothing of the project): what the kernel enforces for every container, and what cri-resmgr and
its agent hold, as JSON lines the host reads and judges (harness/soak/judge.py).

Every INTERVAL seconds it reads each container scope under kubepods.slice: its effective CPUs and
memory nodes, cpu.max, and whether its processes have started (a container made but not started
holds only runc's init; a sandbox holds only `pause`). A read that differs from the last one is
written as a snapshot ("cg") once a second read agrees with it, so a move in progress is never
judged half done; until then each differing read is written as it is ("read"), which the judge
holds only to what counts the moment it is seen (an exclusive CPU under two containers): while
things move all the time no read may agree with the next, and a short overlap would be missed.
Every read looks at each container's CPUs twice and keeps only the CPUs both looks saw, so two
containers read apart while a CPU moved from one to the other never seem to share it. A snapshot
is written at least every HEARTBEAT seconds.
Every PROC_EVERY seconds it writes the RSS and open file descriptors of the daemons' main
processes and the state directory's size. It is cheap on purpose: under emulation every guest
CPU cycle is taken from the node it watches.

    sampler.py OUTPUT [--interval 2]
"""

from __future__ import annotations

import json
import os
import sys
import time

CGROUP = "/sys/fs/cgroup"
PODS = CGROUP + "/kubepods.slice"
UNITS = {"cri-resmgr": ("cri-resmgr.service", "cri-resmgr-nri.service"), "agent": ("cri-resmgr-agent.service",),
         "containerd": ("containerd.service",), "kubelet": ("kubelet.service",)}
STATE_DIR = "/var/lib/cri-resmgr"
FILLER = ".soak-fill"  # what the disk-full fault writes; not the daemon's
HEARTBEAT = 30.0
PROC_EVERY = 10.0
INIT_PREFIX = "runc"  # runc's init before it execs the container's process ("runc", "runc:[2:INIT]", ...)


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def comm(pid: str) -> str:
    """The process's command now ("" for one gone or dead: a zombie runs nothing). Never cached:
    runc's init is "exe" (runc re-executing /proc/self/exe) or "runc:[...]" until it executes the
    container's own process, and a pid seen once as "exe" would stay a started container's
    process ever after."""
    try:
        stat = read(f"/proc/{pid}/stat")
    except OSError:
        return ""
    name, _, rest = stat.partition("(")[2].rpartition(")")
    return "" if rest.split()[:1] in (["Z"], ["X"]) else name


def is_init(name: str) -> bool:
    """runc's init: "runc:[...]", "exe" (runc re-executing /proc/self/exe), or a number (runc
    executing a copy of itself it holds open: the kernel names the process after the descriptor)."""
    return name.startswith(INIT_PREFIX) or name == "exe" or name.isdigit()


def scope(path: str) -> list | None:
    """[pod slice, cpus, mems, cpu.max, cpu.weight, what runs, its commands] of a populated container
    scope, or None. What runs: "started", "created" (runc's init only) or "pause"; its commands: the
    names of the processes besides runc's init (what a finding says runs there)."""
    try:
        pids = read(path + "/cgroup.procs").split()
        if not pids:
            return None
        names = {comm(p) for p in pids} - {""}
        if not names:
            return None
        own = {n for n in names if not is_init(n)}  # what the container's image runs
        runs = "pause" if own == {"pause"} else "started" if own else "created"
        return [os.path.basename(os.path.dirname(path)), read(path + "/cpuset.cpus.effective"),
                read(path + "/cpuset.mems.effective"), read(path + "/cpu.max"), "", runs, ",".join(sorted(own))]
    except OSError:  # gone while read
        return None


def cpus_of(text: str) -> set[int]:
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def cpus_text(cpus: set[int]) -> str:
    parts, run = [], []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def containers() -> dict[str, list]:
    out, paths = {}, {}
    for top, dirs, _ in os.walk(PODS):
        for d in dirs:
            if d.startswith("cri-containerd-") and d.endswith(".scope"):
                cid, path = d[len("cri-containerd-"):-len(".scope")], os.path.join(top, d)
                got = scope(path)
                if got is not None:
                    out[cid], paths[cid] = got, path
    # A second look at each container's CPUs once all were read, keeping what both looks saw: of two
    # containers, the first one's looks straddle the other's first, so a CPU seen under both was
    # under both at once (a CPU moved from one to the other in between is seen under one at most).
    for cid, path in paths.items():
        try:
            again = read(path + "/cpuset.cpus.effective")
        except OSError:
            continue
        if again != out[cid][1]:
            out[cid][1] = cpus_text(cpus_of(again) & cpus_of(out[cid][1]))
    return out


def reads(previous: dict[str, list] | None, tries: int = 5) -> tuple[list[tuple[float, dict[str, list]]], bool]:
    """The reads of one round, each with its time: none if the first is the previous one again; else
    each read that differs from the one before it, up to one a second read agrees with (True) or
    the last try."""
    t, last = time.time(), containers()
    if last == previous:
        return [], True
    seen = [(t, last)]
    for _ in range(tries):
        t, now = time.time(), containers()
        if now == last:
            return seen, True
        seen.append((t, now))
        last = now
    return seen, False


def record(t: float, kind: str, snap: dict[str, list]) -> str:
    return json.dumps({"t": t, "kind": kind, "c": snap}, separators=(",", ":")) + "\n"


def main_pid(units: tuple[str, ...]) -> str:
    for unit in units:
        try:
            pids = read(f"{CGROUP}/system.slice/{unit}/cgroup.procs").split()
        except OSError:
            continue
        if pids:
            return min(pids, key=int)  # the main process was started first (systemd's child)
    return ""


def process(pid: str) -> list | None:
    """[pid, RSS in KiB, open file descriptors]."""
    try:
        rss = next(int(line.split()[1]) for line in read(f"/proc/{pid}/status").splitlines()
                   if line.startswith("VmRSS:"))
        return [int(pid), rss, len(os.listdir(f"/proc/{pid}/fd"))]
    except (OSError, StopIteration, ValueError):
        return None


def state_bytes() -> int:
    total = 0
    for top, _, files in os.walk(STATE_DIR):
        for f in files:
            if f != FILLER:
                try:
                    total += os.lstat(os.path.join(top, f)).st_size
                except OSError:
                    pass
    return total


def main() -> int:
    out_path = sys.argv[1]
    interval = float(sys.argv[sys.argv.index("--interval") + 1]) if "--interval" in sys.argv else 2.0
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    out = open(out_path, "a", buffering=1)
    out.write(json.dumps({"t": time.time(), "kind": "boot"}) + "\n")
    last: dict[str, list] | None = None
    last_written = last_proc = 0.0
    while True:
        started = time.time()
        seen, agreed = reads(last)
        for i, (t, snap) in enumerate(seen):  # every read judged; the one a second read agreed with a snapshot
            confirmed = agreed and i == len(seen) - 1
            out.write(record(t, "cg" if confirmed else "read", snap))
            if confirmed:
                last, last_written = snap, t
        if not seen and last is not None and started - last_written > HEARTBEAT:
            out.write(record(started, "cg", last))
            last_written = started
        if started - last_proc > PROC_EVERY:
            procs = {name: process(pid) for name, units in UNITS.items() if (pid := main_pid(units))}
            out.write(json.dumps({"t": started, "kind": "proc", "p": procs, "state": state_bytes()},
                                 separators=(",", ":")) + "\n")
            last_proc = started
        time.sleep(max(0.0, interval - (time.time() - started)))


if __name__ == "__main__":
    sys.exit(main())
