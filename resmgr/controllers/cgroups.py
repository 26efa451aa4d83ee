"""Where a container's cgroup is, for the cgroupfs and systemd drivers, cgroup v1 and v2; its cpuset
read, and written where the runtime took an update without applying it."""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Protocol

# The systemd scope of a container, by runtime: containerd, CRI-O.
SCOPES = ("cri-containerd-{id}.scope", "crio-{id}.scope")


def cgroup_dirs(cgroup_parent: str, container_id: str) -> list[str]:
    """The places the container's cgroup can be below a hierarchy root, most likely first."""
    if cgroup_parent.endswith(".slice") and "/" not in cgroup_parent.strip("/"):
        # systemd: kubepods-burstable-pod1.slice -> kubepods.slice/kubepods-burstable.slice/...
        name = cgroup_parent.strip("/")
        parts = name[:-len(".slice")].split("-")
        slices = "/".join("-".join(parts[:i + 1]) + ".slice" for i in range(len(parts)))
        return [f"{slices}/{scope.format(id=container_id)}" for scope in SCOPES]
    return [f"{cgroup_parent.strip('/')}/{container_id}"]


def find(root: str | os.PathLike[str], cgroup_parent: str, container_id: str, name: str = "") -> str | None:
    """The first of the container's possible cgroup directories under root that exists
    (and holds the file name, if given)."""
    for rel in cgroup_dirs(cgroup_parent, container_id):
        path = os.path.join(root, rel)
        if os.path.exists(os.path.join(path, name) if name else path):
            return path
    return None


def read_cpuset(cgroup_root: str, cgroup_parent: str, container_id: str) -> tuple[str, str] | None:
    """The container's cgroup cpuset.cpus and cpuset.mems (cgroup v1 or v2), None if not there."""
    for root in (os.path.join(cgroup_root, "cpuset"), cgroup_root):
        base = find(root, cgroup_parent, container_id, "cpuset.cpus")
        if base is None:
            continue
        try:
            with open(os.path.join(base, "cpuset.cpus")) as f:
                cpus = f.read().strip()
            with open(os.path.join(base, "cpuset.mems")) as f:
                mems = f.read().strip()
        except OSError:
            continue
        return cpus, mems
    return None


def write_cpuset(cgroup_root: str, cgroup_parent: str, container_id: str, cpus: str, mems: str) -> str | None:
    """Write the container's cgroup cpuset.cpus and cpuset.mems (those given); the directory written,
    None if the container has no cpuset cgroup. OSError if the kernel refuses a value."""
    for root in (os.path.join(cgroup_root, "cpuset"), cgroup_root):
        base = find(root, cgroup_parent, container_id, "cpuset.cpus")
        if base is None:
            continue
        for name, value in (("cpuset.cpus", cpus), ("cpuset.mems", mems)):
            if value:
                with open(os.path.join(base, name), "w") as f:
                    f.write(value)
        return base
    return None


class Cpusets(Protocol):
    """Where reconciliation reads a container's cpuset back, and writes it (CpusetFiles)."""

    def read(self, cgroup_parent: str, container_id: str) -> tuple[str, str] | None: ...

    def write(self, cgroup_parent: str, container_id: str, cpus: str, mems: str) -> str | None: ...


class CpusetFiles:
    """The containers' cpuset files below one hierarchy root: what reconciliation reads back, and
    writes where the runtime took an update without applying it. The simulated node gives the
    engine its own, which reads and writes its model of the kernel instead."""

    def __init__(self, root: str) -> None:
        self.root = root

    def read(self, cgroup_parent: str, container_id: str) -> tuple[str, str] | None:
        return read_cpuset(self.root, cgroup_parent, container_id)

    def write(self, cgroup_parent: str, container_id: str, cpus: str, mems: str) -> str | None:
        return write_cpuset(self.root, cgroup_parent, container_id, cpus, mems)


async def tell_systemd(unit: str, cpus: str, mems: str, timeout: float = 10.0) -> str:
    """Set a scope's AllowedCPUs and AllowedMemoryNodes as its cgroup now has them, so systemd does not
    put its old ones back when it next applies the unit's properties. "" when done, else why not."""
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        return "no systemctl"
    props = [f"{key}={value}" for key, value in (("AllowedCPUs", cpus), ("AllowedMemoryNodes", mems)) if value]
    proc = await asyncio.create_subprocess_exec(systemctl, "set-property", "--runtime", "--", unit, *props,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(timeout):
            _, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return f"systemctl gave no answer in {timeout:g}s"
    return "" if proc.returncode == 0 else (err.decode(errors="replace").strip() or f"exit {proc.returncode}")
