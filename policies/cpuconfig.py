"""CPU values in the policy configuration: a cpuset or a quantity.

Accepted forms: `cpuset:0-3`, a bare list like `0-3` or `0,2`, `cgroup:<path>` (the
cpuset.cpus of a cgroup below the host's cgroup root), a quantity (`4`, `750m`), or a
YAML number (CPUs).
"""

from __future__ import annotations

from pathlib import Path

from policies.allocator import AllocationError, take_cpus
from policies.base import PolicyError
from resmgr.requirements import RequirementError, parse_cpu
from resmgr.topology.cpuset import CPUSet, CPUSetError
from resmgr.topology.model import Topology


def parse(value: object, what: str, host_root: str = "/") -> CPUSet | int:
    """A CPUSet, or a quantity in milli-CPU."""
    if isinstance(value, bool):
        raise PolicyError(f"{what}: {value!r} is neither a cpuset nor a CPU quantity")
    if isinstance(value, int | float):
        return round(value * 1000)
    text = str(value).strip()
    try:
        if text.startswith("cpuset:"):
            return CPUSet.parse(text[len("cpuset:"):])
        if text.startswith("cgroup:"):
            path = Path(host_root) / "sys/fs/cgroup/cpuset" / text[len("cgroup:"):].lstrip("/") / "cpuset.cpus"
            try:
                return CPUSet.parse(path.read_text())
            except OSError as err:
                raise PolicyError(f"{what}: cannot read {path}: {err.strerror or err}") from None
        if "," in text or "-" in text:
            return CPUSet.parse(text)
        return parse_cpu(text)
    except (CPUSetError, RequirementError) as err:
        raise PolicyError(f"{what}: {err}") from None


def resolve(value: object, what: str, topology: Topology, within: CPUSet) -> CPUSet:
    """A cpuset within `within`; a quantity is rounded up and taken topology-compactly."""
    parsed = parse(value, what)
    if isinstance(parsed, CPUSet):
        outside = parsed - within
        if outside:
            raise PolicyError(f"{what}: CPUs {outside} are not available on this machine "
                              f"(available: {within or 'none'})")
        return parsed
    count = -(-parsed // 1000)
    try:
        return take_cpus(topology, within, count)
    except AllocationError as err:
        raise PolicyError(f"{what}: {err}") from None
