"""The balloons policy (policy.py) and its configuration (types.py)."""

from policies.balloons.policy import BalloonsPolicy

__all__ = ["BalloonsPolicy"]
