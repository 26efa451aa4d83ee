#!/usr/bin/python3
"""What the soak asks the node after a fault, in one go (run inside the guest with its own Python,
cheaply: a Python program of the project takes seconds to start under emulation): the units'
states and restarts, every container scope systemd still has, what containerd lists, what
cri-resmgr's state file holds, and its metric of failing state writes. One JSON document on stdout.

    inspect.py UNIT
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

PODS = "/sys/fs/cgroup/kubepods.slice"
STATE = "/var/lib/cri-resmgr/cache"
CONTAINERD = "unix:///var/run/containerd/containerd.sock"
METRICS = "http://127.0.0.1:8891/metrics"


def run(*cmd: str, timeout: float = 30) -> tuple[int, str]:
    """(exit status, standard output): what a command says on stderr (systemctl's "Connection timed
    out" on a busy node, say) must not be read as its answer."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, ""
    return done.returncode, done.stdout.strip()


def scopes() -> list[str]:
    out = []
    for _, dirs, _ in os.walk(PODS):
        out += [d[len("cri-containerd-"):-len(".scope")] for d in dirs
                if d.startswith("cri-containerd-") and d.endswith(".scope")]
    return out


def crictl(*args: str) -> str | None:
    code, out = run("crictl", "--runtime-endpoint", CONTAINERD, "--timeout", "10s", *args)
    return out if code == 0 else None


def state() -> dict:
    try:
        with open(STATE) as f:
            doc = json.load(f)
        mtime = os.stat(STATE).st_mtime
    except (OSError, ValueError) as err:
        return {"error": str(err)}
    # Where cri-resmgr says each container runs: [cpus, memory nodes, a move still in flight].
    placed = {c["id"]: [c.get("resources", {}).get("cpuset_cpus", ""), c.get("resources", {}).get("cpuset_mems", ""),
                        bool(c.get("pending"))] for c in doc.get("containers", [])}
    return {"containers": [c["id"] for c in doc.get("containers", [])], "pods": [p["id"] for p in doc.get("pods", [])],
            "claims": len(doc.get("claims", [])), "mtime": mtime, "placed": placed}


def failing() -> dict[str, float] | None:
    """cri_resmgr_state_write_failing by file (None: no answer)."""
    try:
        text = urllib.request.urlopen(METRICS, timeout=10).read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        if line.startswith("cri_resmgr_state_write_failing{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('file="', 1)[1].split('"', 1)[0]] = float(value)
    return out


def describe(c: dict) -> str:
    labels = c.get("labels") or {}
    meta = c.get("metadata") or {}
    return (f"{c['state'].removeprefix('CONTAINER_').lower()} {labels.get('io.kubernetes.pod.name', '?')}/"
            f"{meta.get('name', '?')}#{meta.get('attempt', 0)}")


def main() -> int:
    unit = sys.argv[1]
    units = [unit, "cri-resmgr-agent", "containerd", "kubelet"]
    _, active = run("systemctl", "is-active", *units)
    _, restarts = run("systemctl", "show", "-p", "NRestarts", "--value", unit, "cri-resmgr-agent")
    # What cgroups and the state file hold is read before containerd is asked: whatever they hold
    # then that containerd does not list is gone, not made meanwhile.
    held, saved = scopes(), state()
    listed = crictl("ps", "-a", "-o", "json")
    containers = json.loads(listed)["containers"] if listed is not None else None
    sandboxes = crictl("pods", "-q")
    print(json.dumps({
        "units": {u: (state[0] if state else "unknown") for u, state in
                  zip(units, [line.split() for line in active.splitlines()] + [[]] * len(units), strict=False)},
        "restarts": dict(zip((unit, "cri-resmgr-agent"), map(int, restarts.split()), strict=False)),
        "relay_socket": os.path.exists("/var/run/cri-resmgr/cri-resmgr.sock"),
        "scopes": held,
        "containers": None if containers is None else [c["id"] for c in containers],
        "running": None if containers is None else [c["id"] for c in containers if c["state"] == "CONTAINER_RUNNING"],
        # What a finding names a container by: its state, pod and attempt as containerd has them.
        "described": None if containers is None else {c["id"][:12]: describe(c) for c in containers},
        "sandboxes": None if sandboxes is None else sandboxes.split(),
        "state": saved, "failing": failing(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
