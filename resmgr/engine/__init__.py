"""The engine: state ledger, lifecycle decisions, reconciliation with the runtime, persistence."""

from resmgr.engine.lifecycle import Engine, NotReady

__all__ = ["Engine", "NotReady"]
