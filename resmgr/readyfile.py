"""A readiness file: present, and rewritten every few seconds, while a daemon is ready.

A probe that asks the daemon over its socket starts a Python process each time (about 0.3 s of
CPU); `find PATH -mmin -1` costs a millisecond. The file is rewritten while the daemon is ready,
so one whose event loop hangs goes stale and fails the probe as one that says it is not ready.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("cri-resmgr.ready")

PERIOD = 10.0  # well inside the minute `find -mmin -1` allows
WAITING = 0.5  # while not ready: a start is seen at once (the judgements are in memory)


class ReadyFile:
    def __init__(self, path: str, what: str) -> None:
        self.path = Path(path)
        self.what = what
        self.why_not: str | None = None  # None: not judged yet

    def set(self, why_not: str) -> None:
        """Ready when why_not is empty: the file written (again); else removed."""
        if why_not != self.why_not:
            if why_not:
                log.info("%s not ready: %s", self.what, why_not)
            else:
                log.info("%s ready", self.what)
        self.why_not = why_not
        try:
            if why_not:
                self.path.unlink(missing_ok=True)
            else:
                tmp = self.path.with_name(f".{self.path.name}.tmp")
                tmp.write_text("ok\n")
                tmp.replace(self.path)
        except OSError as err:
            log.warning("readiness file %s: %s", self.path, err)

    async def keep(self, why_not: Callable[[], str], period: float = PERIOD, waiting: float = WAITING) -> None:
        """Judge readiness until cancelled: every period while ready, more often while not; the file
        goes with the task."""
        try:
            while True:
                self.set(why_not())
                await asyncio.sleep(waiting if self.why_not else period)
        finally:
            self.set("stopped")
