"""The topology-aware policy: pools from the hardware tree."""

from resmgr.policies.topology_aware.policy import TopologyAwarePolicy

__all__ = ["TopologyAwarePolicy"]
