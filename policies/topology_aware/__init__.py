"""The topology-aware policy: pools from the hardware tree."""

from policies.topology_aware.policy import TopologyAwarePolicy

__all__ = ["TopologyAwarePolicy"]
