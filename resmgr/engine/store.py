"""Persisted engine state: one JSON file, written atomically.

Writes go to a temporary file that is fsynced and renamed over the old one, so a
crash (kill -9 included) leaves either the old or the new state, never a mix.
Saves are coalesced: callers that ask while a write is running share the next one.

A write that fails (the file system full or read-only) never fails the call that asked for
it: the decisions stay in memory, the failure is reported (a log line, a metric, `problem`
for the status and the agent), and `keep_written` writes the state once it can. It also
watches the file system: a quiet node may have no write due for minutes, so when the next write
might not fit, or the file system turned read-only, it writes at once, and a failure is reported
when the disk fills, not when a pod next comes; so is a file system too full for a new state
beside the old one while writes still work (each fitting in the blocks the last one freed). What is lost
if the daemon dies meanwhile is rebuilt from the runtime at the next start, as after any
crash; only what the runtime cannot tell (a prepared DRA claim) insists on the disk
(`save(strict=True)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
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

# The state file's format: a file says which it needs ("version"). A writer gives the oldest version
# that holds what it writes (data may name a newer one), so a daemon one release older reads it
# wherever it can; a reader takes every version up to NEWEST and refuses a newer one (StateTooNew)
# instead of starting afresh on a state it cannot understand.
VERSION = 1
NEWEST = 2
KEEP_BROKEN = 3  # broken state files kept for a post-mortem; older ones are removed
RETRY_FIRST = 1.0  # seconds before the first retry of a failed write
RETRY_MAX = 30.0  # longest wait between retries while writes fail
SPACE_EVERY = 10.0  # seconds between looks at the free space while writes work
SPACE_MARGIN = 64 << 10  # free bytes beyond two states' worth (the new file beside the old) that count as room


class StateFileError(Exception):
    pass


class StateInUse(Exception):
    pass


class StateTooNew(Exception):
    """The state file was written by a newer cri-resmgr, in a format this one cannot read."""


class StateNotWritten(Exception):
    """A strict save could not write the state (the reason is the message)."""


def boot_time(path: str = "/proc/stat") -> float:
    """When the node booted (seconds since the epoch; 0.0 where it cannot be read)."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


class StateStore:
    def __init__(self, directory: str | Path, name: str = "cache",
                 on_loss: str = "rebuilding from the runtime") -> None:
        self.dir = Path(directory)
        self.path = self.dir / name
        self.on_loss = on_loss  # what happens instead, for the log
        self._lock = asyncio.Lock()
        self._wanted = 0  # generation requested
        self._written = 0  # generation on disk
        self.failing: str = ""  # why the last write failed ("" while writes work)
        self.failing_since = 0.0  # wall-clock time of the first failure in a row
        self._failures = 0
        self._retry = asyncio.Event()  # set when a write failed and must be tried again
        self._snapshot: Callable[[], dict[str, Any]] | None = None
        self._size = 0  # bytes of the last state written
        # Why the file system has no room for a write beside the old state, though writes still
        # work ("" while it has): each write may fit only in the blocks the last one freed.
        self.cramped: str = ""

    @property
    def tmp(self) -> Path:
        return self.path.with_name(f".{self.path.name}.tmp")

    def prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # A write cut short by a crash leaves its temporary file: it holds room a full disk needs.
        try:
            self.tmp.unlink()
        except FileNotFoundError:
            pass
        except OSError as err:
            log.warning("cannot remove %s: %s", self.tmp, err)

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

    def written_before(self, when: float) -> bool:
        """Whether the state file was last written before when (seconds since the epoch)."""
        try:
            return self.path.stat().st_mtime < when
        except OSError:
            return False

    def load(self, check: Callable[[Any], None] | None = None) -> dict[str, Any] | None:
        """The saved state, or None. A file that is broken, or that check (raising ValueError)
        refuses, is moved aside and logged, never fatal; one of a newer version than this daemon
        reads raises StateTooNew and stays where it is."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        try:
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise StateFileError(f"{self.path} is group or world writable; refusing to trust it")
            data = json.loads(self.path.read_bytes())
            if not isinstance(data, dict):
                raise StateFileError(f"{self.path}: not a JSON object")
            version = data.get("version")
            if type(version) is int and version > NEWEST:
                raise StateTooNew(f"{self.path} was written by a newer cri-resmgr (state version {version}; this "
                                  f"one reads versions up to {NEWEST}). Run the newer cri-resmgr again, or move "
                                  f"the file aside to start without it: running containers are then adopted "
                                  f"with the CPUs they have")
            if type(version) is not int or not VERSION <= version <= NEWEST:
                raise StateFileError(f"{self.path}: unsupported state version {version!r}")
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
        """Synchronous atomic write (OSError: nothing changed on disk, the temporary file removed)."""
        # default=str: a YAML value JSON has no type for (a date) must not make every save fail.
        payload = memoryview(json.dumps({"version": VERSION, **data}, sort_keys=True, separators=(",", ":"),
                                        default=str).encode())
        tmp = self.tmp
        self._size = len(payload)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                while payload:  # a write may take only part of it
                    payload = payload[os.write(fd, payload):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    async def save(self, snapshot: Callable[[], dict[str, Any]], strict: bool = False) -> None:
        """Persist the state as it is now (or later); returns once it is on disk, or once the write
        failed: then the failure is reported and keep_written tries again. strict: a failure
        raises StateNotWritten instead (also when an earlier write is failing)."""
        self._snapshot = snapshot
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
            except OSError as err:
                metrics.state_saved(time.perf_counter() - started, False)
                self._failed(err)
                if strict:
                    raise StateNotWritten(self.failing) from None
                return
            metrics.state_saved(time.perf_counter() - started, True)
            self._written = generation
            self._recovered()

    def _failed(self, err: OSError) -> None:
        self._failures += 1
        self._retry.set()
        if not self.failing:
            self.failing_since = time.time()
            log.error("cannot write the state to %s: %s; decisions are kept in memory and written as soon as "
                      "the file system takes them (a restart meanwhile rebuilds them from the runtime)",
                      self.path, err.strerror or err)
        self.failing = f"cannot write the state to {self.path}: {err.strerror or err}"
        metrics.state_failing(self.path.name, True)

    def _recovered(self) -> None:
        if self.failing:
            log.warning("the state is written to %s again, after %.0f s and %d failed writes", self.path,
                        time.time() - self.failing_since, self._failures)
            self.failing, self._failures = "", 0
            metrics.state_failing(self.path.name, bool(self.cramped))
        self._retry.clear()

    @property
    def problem(self) -> str:
        """What an operator should know about the state file ("" when all is well)."""
        if not self.failing:
            return self.cramped
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.failing_since))
        return f"{self.failing} (since {since}); decisions are kept in memory until it can be written"

    async def keep_written(self) -> None:
        """Runs for the daemon's life: write the latest state again after a failed write, backing off
        while writes keep failing; while they work, write at once when the disk may be too full."""
        while True:
            try:
                async with asyncio.timeout(SPACE_EVERY):
                    await self._retry.wait()
            except TimeoutError:
                if self._snapshot is None:
                    continue
                room = await asyncio.to_thread(self._room)
                if room is not None:
                    await self.save(self._snapshot)  # a failure now is reported now
                self._note_room(room)
                continue
            await asyncio.sleep(min(RETRY_FIRST * 2 ** max(0, self._failures - 1), RETRY_MAX))
            if self._snapshot is not None and self.failing:
                await self.save(self._snapshot)

    def _room(self) -> str | None:
        """Why the state directory's file system may not take the next write (None: it may): too
        full, or read-only (as a file system remounts itself after an error)."""
        try:
            fs = os.statvfs(self.dir)
        except OSError:
            return None
        if fs.f_flag & os.ST_RDONLY:
            return "its file system is read-only"
        need = 2 * self._size + SPACE_MARGIN
        fits = self._fits(need)
        # Root writes into the blocks the file system keeps back from others.
        free = (fs.f_bfree if os.geteuid() == 0 else fs.f_bavail) * fs.f_frsize
        if fits is None:
            fits = free >= need
        if fits:
            return None
        return f"its file system is full ({free} bytes free, {need} wanted for a new state beside the old)"

    def _fits(self, need: int) -> bool | None:
        """Whether the file system gives need bytes now, asked by allocating them and letting them go
        (None: it cannot be asked so). Its free count cannot tell: ext4 counts as free, even for root,
        blocks it gives nobody (up to 16 MiB), and a full disk would pass for one with room."""
        probe = self.path.with_name(f".{self.path.name}.room")
        fd = -1
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.posix_fallocate(fd, 0, need)
            return True
        except OSError as err:
            return False if err.errno in (errno.ENOSPC, errno.EDQUOT) else None
        finally:
            if fd >= 0:
                os.close(fd)
                with contextlib.suppress(OSError):
                    probe.unlink()

    def _note_room(self, room: str | None) -> None:
        """A write that worked on a full file system fit in the blocks the one before freed (the
        disk filled while both were there): the next, larger state will not. Reported as a
        failure is, until there is room again."""
        cramped = f"cannot write the state to {self.path} safely: {room}" if room else ""
        if cramped and not self.cramped and not self.failing:
            log.error("%s; it is written while it fits, and kept in memory once it does not", cramped)
        elif self.cramped and not cramped:
            log.warning("the file system of %s has room for the state again", self.path)
        self.cramped = cramped
        metrics.state_failing(self.path.name, bool(self.failing or cramped))

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
