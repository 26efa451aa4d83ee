"""Logging set-up: one stderr handler; debug output per source (logger name) or for all."""

from __future__ import annotations

import logging
import sys

ROOT = "cri-resmgr"


class _Debug:
    """What set_debug needs to undo and keep: the base level and the command line's sources."""

    level: int = logging.INFO
    fixed: list[str] = []
    debugged: set[str] = set()


def setup(level: str = "INFO", fixed_sources: list[str] | None = None) -> None:
    """One stderr handler at level; fixed_sources (from the command line) always debug."""
    root = logging.getLogger(ROOT)
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.propagate = False
    _Debug.level = logging.getLevelNamesMapping()[level.upper()]
    _Debug.fixed = list(fixed_sources or [])
    set_debug([])


def set_debug(sources: list[str]) -> None:
    """Debug these sources (and the fixed ones); '*' or 'all' debugs everything."""
    wanted = [*_Debug.fixed, *sources]
    everything = any(s in ("*", "all") for s in wanted)
    logging.getLogger(ROOT).setLevel(logging.DEBUG if everything else _Debug.level)
    for name in _Debug.debugged:
        logging.getLogger(name).setLevel(logging.NOTSET)
    _Debug.debugged = {f"{ROOT}.{s}" for s in wanted if s not in ("*", "all")}
    for name in _Debug.debugged:
        logging.getLogger(name).setLevel(logging.DEBUG)
