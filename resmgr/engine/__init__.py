"""The engine: state ledger, lifecycle decisions, reconciliation with the runtime, persistence."""

from resmgr.engine.engine import Engine
from resmgr.engine.state import NotReady

__all__ = ["Engine", "NotReady"]
