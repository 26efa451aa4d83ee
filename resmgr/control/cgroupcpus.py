"""`cgroup:<path>` CPU values in the policy section, resolved to CPU sets when a configuration is loaded.

A policy never reads the node: it gets `cpuset:<list>` in place of `cgroup:<path>`. The
path is below the cgroup root (a bare `/path` too, as cri-resource-manager writes it, unless it is
a cgroup directory itself, as nri-plugins writes it); cgroup v1 keeps cpusets in its `cpuset` hierarchy, v2 in
the unified one, where `cpuset.cpus.effective` says what the group really gets.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from resmgr.config.document import ConfigError
from resmgr.topology.cpuset import CPUSet, CPUSetError

SECTIONS = ("AvailableResources", "ReservedResources")


def read_cgroup_cpus(cgroup_root: str, path: str) -> CPUSet:
    """The CPUs of the cgroup at path (v1 or v2); ConfigError naming what was tried."""
    rel = path.strip().lstrip("/")
    candidates = [os.path.join(cgroup_root, "cpuset", rel, "cpuset.effective_cpus"),
                  os.path.join(cgroup_root, "cpuset", rel, "cpuset.cpus"),
                  os.path.join(cgroup_root, rel, "cpuset.cpus.effective"),
                  os.path.join(cgroup_root, rel, "cpuset.cpus")]
    for file in candidates:
        try:
            with open(file) as f:
                text = f.read().strip()
        except OSError:
            continue
        if not text:
            continue  # v2 leaves cpuset.cpus empty when the group inherits
        try:
            return CPUSet.parse(text)
        except CPUSetError as err:
            raise ConfigError(f"cgroup:{path}: {file}: {err}") from None
    raise ConfigError(f"cgroup:{path}: no cpuset for that cgroup under {cgroup_root} (cgroup v1 or v2)")


def resolve(section: dict[str, Any], cgroup_root: str) -> dict[str, Any]:
    """A copy of the policy section with every `cgroup:` CPU value replaced by `cpuset:<list>`."""
    out = copy.deepcopy(section)
    for name in SECTIONS:
        res = out.get(name)
        if not isinstance(res, dict):
            continue
        for key in ("cpu", "CPU"):
            value = res.get(key)
            if isinstance(value, str) and value.strip().startswith("cgroup:"):
                path = value.strip()[len("cgroup:"):]
                try:
                    res[key] = f"cpuset:{read_cgroup_cpus(cgroup_root, path)}"
                except ConfigError as err:
                    raise ConfigError(f"policy.{name}.{key}: {err}") from None
            elif isinstance(value, str) and value.strip().startswith("/"):
                res[key] = f"cpuset:{read_cgroup_path(value.strip(), cgroup_root, f'policy.{name}.{key}')}"
    return out


def read_cgroup_path(path: str, cgroup_root: str, what: str) -> CPUSet:
    """A bare directory: nri-plugins' form, the cgroup's own directory (its mount point included),
    else cri-resource-manager's, a cgroup below the cpuset hierarchy (`/my-cpus`)."""
    try:
        return read_cgroup_dir(path, what)
    except ConfigError as err:
        try:
            return read_cgroup_cpus(cgroup_root, path)
        except ConfigError:
            raise ConfigError(f"{err}, nor a cgroup below {cgroup_root}") from None


def read_cgroup_dir(path: str, what: str) -> CPUSet:
    """The CPUs of the cgroup directory at path (v2's effective set first, then v1's files)."""
    for file in ("cpuset.cpus.effective", "cpuset.effective_cpus", "cpuset.cpus"):
        try:
            with open(os.path.join(path, file)) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text:
            try:
                return CPUSet.parse(text)
            except CPUSetError as err:
                raise ConfigError(f"{what}: {path}/{file}: {err}") from None
    raise ConfigError(f"{what}: {path}: not a cgroup directory with a cpuset")
