"""Topology hints: the NUMA nodes a container's devices are attached to.

A device node (`/dev/...`) is followed through `/sys/dev/{char,block}/MAJOR:MINOR` to its
sysfs device, and up the device tree to the first `numa_node` file (PCI devices have
one; -1 means the kernel does not know). Devices without one give no hint.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path


def device_numa_nodes(host_path: str, host_root: str = "/") -> list[int]:
    """NUMA nodes of a device node, [] when unknown."""
    try:
        st = os.stat(host_path)
    except OSError:
        return []
    kind = "char" if stat.S_ISCHR(st.st_mode) else "block" if stat.S_ISBLK(st.st_mode) else None
    if kind is None:
        return []
    sys_root = Path(host_root) / "sys"
    link = sys_root / "dev" / kind / f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    try:
        here = link.resolve(strict=True)
    except OSError:
        return []
    devices = (sys_root / "devices").resolve()
    while here != devices and devices in here.parents:
        try:
            node = int((here / "numa_node").read_text().strip())
        except (OSError, ValueError):
            here = here.parent
            continue
        return [node] if node >= 0 else []
    return []


def hints(host_paths: Iterable[str], host_root: str = "/") -> dict[str, list[int]]:
    """{device: NUMA nodes} for the devices that have a known NUMA node."""
    out = {}
    for path in host_paths:
        nodes = device_numa_nodes(path, host_root)
        if nodes:
            out[path] = nodes
    return out
