"""Persisted engine state: one JSON file, written atomically.

Writes go to a temporary file that is fsynced and renamed over the old one, so a
crash (kill -9 included) leaves either the old or the new state, never a mix.
Saves are coalesced: callers that ask while a write is running share the next one.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resmgr import metrics

log = logging.getLogger("cri-resmgr.engine.store")

VERSION = 1
KEEP_BROKEN = 3  # broken state files kept for a post-mortem; older ones are removed


class StateFileError(Exception):
    pass


class StateInUse(Exception):
    pass


class StateStore:
    def __init__(self, directory: str | Path, name: str = "cache",
                 on_loss: str = "rebuilding from the runtime") -> None:
        self.dir = Path(directory)
        self.path = self.dir / name
        self.on_loss = on_loss  # what happens instead, for the log
        self._lock = asyncio.Lock()
        self._wanted = 0  # generation requested
        self._written = 0  # generation on disk

    def prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def claim(self) -> None:
        """Hold the directory for this process (StateInUse if another holds it): two daemons
        on one state, a relay and an NRI plugin say, would book the same CPUs twice."""
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateInUse(f"another cri-resmgr uses the state in {self.dir}") from None
        self._claim = fd  # held until the process exits

    def load(self, check: Callable[[Any], None] | None = None) -> dict[str, Any] | None:
        """The saved state, or None. A file that is broken, or that check (raising ValueError)
        refuses, is moved aside and logged, never fatal."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        try:
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise StateFileError(f"{self.path} is group or world writable; refusing to trust it")
            data = json.loads(self.path.read_bytes())
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise StateFileError(f"{self.path}: unsupported state version {data.get('version')!r}"
                                     if isinstance(data, dict) else f"{self.path}: not a JSON object")
            if check is not None:
                check(data)
            return data
        except (OSError, ValueError, RecursionError, StateFileError) as err:
            aside = self.path.with_name(f"{self.path.name}.broken-{time.time_ns() // 1000}")
            try:
                os.replace(self.path, aside)
            except OSError:
                aside = self.path
            log.error("state file %s is unusable (%s); moved to %s, %s", self.path,
                      str(err)[:300] or type(err).__name__, aside, self.on_loss)
            self._prune_broken()
            return None

    def _prune_broken(self) -> None:
        """Keep the newest KEEP_BROKEN broken copies: a disk or a state that keeps failing
        must not fill the state directory, one copy per start."""
        prefix = f"{self.path.name}.broken-"
        copies = sorted((p for p in self.dir.iterdir() if p.name.startswith(prefix)),
                        key=lambda p: int(p.name[len(prefix):]) if p.name[len(prefix):].isdigit() else 0)
        for old in copies[:-KEEP_BROKEN]:
            try:
                old.unlink()
            except OSError as err:
                log.warning("cannot remove old broken state file %s: %s", old, err)

    def write(self, data: dict[str, Any]) -> None:
        """Synchronous atomic write."""
        # default=str: a YAML value JSON has no type for (a date) must not make every save fail.
        payload = json.dumps({"version": VERSION, **data}, sort_keys=True, separators=(",", ":"), default=str)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, payload.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    async def save(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        """Persist the state as it is now (or later); returns once it is on disk."""
        self._wanted += 1
        target = self._wanted
        async with self._lock:
            if self._written >= target:
                return  # a write that started after our request already covered it
            generation = self._wanted
            data = snapshot()
            started = time.perf_counter()
            try:
                await asyncio.to_thread(self.write, data)
            except Exception:
                metrics.state_saved(time.perf_counter() - started, False)
                raise
            metrics.state_saved(time.perf_counter() - started, True)
            self._written = generation

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
