"""The balloons policy (policy.py) and its configuration (types.py)."""

from resmgr.policies.balloons.policy import BalloonsPolicy

__all__ = ["BalloonsPolicy"]
