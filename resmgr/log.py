"""Logging set-up: one stderr handler; debug output per source (logger name) or for all."""

from __future__ import annotations

import logging
import sys

ROOT = "cri-resmgr"


def setup(level: str = "INFO", debug_sources: list[str] | None = None) -> None:
    root = logging.getLogger(ROOT)
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.propagate = False
    root.setLevel(level.upper())
    for source in debug_sources or []:
        name = ROOT if source in ("*", "all") else f"{ROOT}.{source}"
        logging.getLogger(name).setLevel(logging.DEBUG)
