"""CPU values in the policy configuration: a cpuset or a quantity.

Accepted forms: `cpuset:0-3`, a bare list like `0-3` or `0,2`, `exclude-cpuset:0-1` (every CPU
there is but those, as nri-plugins writes it), a quantity (`4`, `750m`), or a YAML number
(CPUs). `cgroup:<path>` is resolved to a cpuset when the configuration is loaded
(resmgr.control.cgroupcpus); a policy never reads the node itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resmgr.policies.toolkit.allocator import AllocationError, take_cpus
from resmgr.policies.toolkit.errors import PolicyError
from resmgr.requests import RequirementError, parse_cpu
from resmgr.topology.cpuset import CPUSet, CPUSetError
from resmgr.topology.model import Topology


def parse(value: object, what: str) -> CPUSet | int:
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
            raise PolicyError(f"{what}: {text} was not resolved to a cpuset when the configuration was loaded")
        if "," in text or "-" in text:
            return CPUSet.parse(text)
        return parse_cpu(text)
    except (CPUSetError, RequirementError) as err:
        raise PolicyError(f"{what}: {err}") from None


def resolve(value: object, what: str, topology: Topology, within: CPUSet, first: bool = False) -> CPUSet:
    """A cpuset within `within`; a quantity is rounded up and taken topology-compactly (first: from
    the first NUMA node that holds it, as cri-resource-manager takes reserved CPUs, not next to the
    kernel-isolated ones the allocator would pack it against); `exclude-cpuset:LIST` is `within`
    without LIST."""
    text = value.strip() if isinstance(value, str) else ""
    if text.startswith("exclude-cpuset:"):
        try:
            return within - CPUSet.parse(text[len("exclude-cpuset:"):])
        except CPUSetError as err:
            raise PolicyError(f"{what}: {err}") from None
    parsed = parse(value, what)
    if isinstance(parsed, CPUSet):
        outside = parsed - within
        if outside:
            raise PolicyError(f"{what}: CPUs {outside} are not available on this machine "
                              f"(available: {within or 'none'})")
        return parsed
    count = -(-parsed // 1000)
    if first:
        for node in sorted(topology.nodes):
            here = within & topology.node_cpus(node)
            if len(here) >= count:
                within = here
                break
    try:
        return take_cpus(topology, within, count)
    except AllocationError as err:
        raise PolicyError(f"{what}: {err}") from None


def cpu_resources(config: Mapping[str, Any], section: str) -> object | None:
    """The `cpu` value of the AvailableResources or ReservedResources section, None if absent."""
    res = config.get(section) or {}
    if not isinstance(res, Mapping):
        raise PolicyError(f"policy.{section}: expected a mapping like {{cpu: 2}}")
    return res.get("cpu", res.get("CPU"))


@dataclass(frozen=True)
class CPUs:
    """The CPUs a policy may use: available (isolated ones included), isolated, reserved."""

    available: CPUSet
    isolated: CPUSet
    reserved: CPUSet

    @property
    def general(self) -> CPUSet:
        """Available CPUs the kernel does not isolate: the shared and reserved pools come from these."""
        return self.available - self.isolated


def resolve_cpus(config: Mapping[str, Any], topology: Topology) -> CPUs:
    """Available, isolated and reserved CPUs from the policy section and the machine.

    Available: online CPUs narrowed by AvailableResources; isolated: the kernel-isolated
    ones among them; reserved: ReservedResources taken from the general (non-isolated) ones.
    """
    online = topology.online
    avail_cfg = cpu_resources(config, "AvailableResources")
    available = resolve(avail_cfg, "policy.AvailableResources.cpu", topology, online) \
        if avail_cfg is not None else online
    isolated = available & topology.isolated
    reserved_cfg = cpu_resources(config, "ReservedResources")
    reserved = resolve(reserved_cfg, "policy.ReservedResources.cpu", topology, available - isolated, first=True) \
        if reserved_cfg is not None else CPUSet()
    return CPUs(available, isolated, reserved)
