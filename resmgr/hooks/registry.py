"""Runtime hook plugins registered by JSON files in a watched directory.

Each `*.json` file registers one plugin, named after the file:

    {"remote-endpoint": "/run/plugin.sock", "failure-policy": "Ignore",
     "runtime-hooks": ["PreCreateContainer"], "timeout": "2s"}

The directory is watched with inotify; files created, changed, renamed or deleted take
effect at once. A file that does not register a plugin is logged once (until it
changes) and ignored; the other plugins keep working.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from resmgr import sockets

if TYPE_CHECKING:
    from asyncinotify import Inotify

log = logging.getLogger("cri-resmgr.hooks")

DEFAULT_DIR = "/etc/runtime/hookserver.d"
DEFAULT_TIMEOUT = 2.0  # seconds: well inside kubelet's 2-minute CRI deadline
MAX_TIMEOUT = 110.0  # a call never waits longer than that, whatever a file says
SETTLE = 0.05  # an editor's save is several events: read the directory once they stop


class Hook(StrEnum):
    PRE_RUN_POD_SANDBOX = "PreRunPodSandbox"
    PRE_CREATE_CONTAINER = "PreCreateContainer"
    PRE_START_CONTAINER = "PreStartContainer"
    POST_START_CONTAINER = "PostStartContainer"
    PRE_UPDATE_CONTAINER_RESOURCES = "PreUpdateContainerResources"
    POST_STOP_CONTAINER = "PostStopContainer"
    POST_STOP_POD_SANDBOX = "PostStopPodSandbox"

    @property
    def pre(self) -> bool:
        return self.value.startswith("Pre")


class FailurePolicy(StrEnum):
    FAIL = "Fail"
    IGNORE = "Ignore"


@dataclass(frozen=True)
class PluginSpec:
    name: str  # the file name without .json; plugins are called in this order
    endpoint: str
    failure_policy: FailurePolicy
    hooks: frozenset[Hook]
    timeout: float
    path: str


class BadPlugin(ValueError):
    pass


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0}


def _timeout(value: object) -> float:
    if isinstance(value, bool):
        raise BadPlugin("timeout: expected seconds (a number) or a duration such as \"500ms\" or \"2s\"")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m)?\s*", value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    else:
        raise BadPlugin(f"timeout: {value!r} is not a duration (use e.g. \"500ms\", \"2s\" or 2)")
    if not 0 < seconds <= MAX_TIMEOUT:
        raise BadPlugin(f"timeout: {value!r} is out of range (more than 0, at most {MAX_TIMEOUT:g}s)")
    return seconds


def parse(path: Path, text: str, default_timeout: float = DEFAULT_TIMEOUT) -> PluginSpec:
    """The plugin a registration file describes (BadPlugin saying why it does not)."""
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise BadPlugin(f"not JSON: {err}") from None
    except RecursionError:
        raise BadPlugin("not JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise BadPlugin(f"expected a JSON object, got {type(doc).__name__}")
    known = {"remote-endpoint", "failure-policy", "runtime-hooks", "timeout"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise BadPlugin(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    endpoint = doc.get("remote-endpoint")
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise BadPlugin("remote-endpoint: missing (the unix socket path of the plugin)")
    endpoint = sockets.path_of(endpoint.strip())
    if not endpoint.startswith("/"):
        raise BadPlugin(f"remote-endpoint: {endpoint!r} is not an absolute unix socket path")
    policy = doc.get("failure-policy", "Ignore")
    if policy in ("", None):
        policy = "Ignore"
    if policy not in FailurePolicy._value2member_map_:
        raise BadPlugin(f"failure-policy: {policy!r} is neither Fail nor Ignore")
    hooks = doc.get("runtime-hooks")
    if not isinstance(hooks, list) or not all(isinstance(h, str) for h in hooks):
        raise BadPlugin("runtime-hooks: expected a list of hook names")
    for h in hooks:
        if h not in Hook._value2member_map_:
            raise BadPlugin(f"runtime-hooks: unknown hook {h!r} (known: {', '.join(Hook)})")
    timeout = _timeout(doc["timeout"]) if "timeout" in doc else default_timeout
    return PluginSpec(path.stem, endpoint, FailurePolicy(policy), frozenset(Hook(h) for h in hooks), timeout,
                      str(path))


class Registry:
    """The plugins registered in a directory, kept current by `watch`.

    on_change(specs) gets the full set of valid registrations (by name) after every
    change; the caller keeps its plugin connections in step with it.
    """

    def __init__(self, directory: str, on_change: Callable[[dict[str, PluginSpec]], None],
                 default_timeout: float = DEFAULT_TIMEOUT) -> None:
        self.directory = Path(directory)
        self.on_change = on_change
        self.default_timeout = default_timeout
        self.specs: dict[str, PluginSpec] = {}
        self._seen: dict[str, tuple[tuple[int, int, int], PluginSpec | None]] = {}
        self._complained: dict[str, str] = {}

    def scan(self) -> None:
        """Read the directory again and take what it registers."""
        self.take(self.read())

    async def rescan(self) -> None:
        """scan, with the file reads off the event loop."""
        self.take(await asyncio.to_thread(self.read))

    def read(self) -> dict[str, PluginSpec]:
        """The registrations in the directory; files that did not change are not parsed again."""
        seen: dict[str, tuple[tuple[int, int, int], PluginSpec | None]] = {}
        try:
            entries = [e for e in os.scandir(self.directory) if e.name.endswith(".json")]
        except FileNotFoundError:
            entries = []
        except OSError as err:
            log.error("cannot read the hook plugin directory %s: %s", self.directory, err.strerror or err)
            entries = []
        for entry in sorted(entries, key=lambda e: e.name):
            try:
                st = entry.stat()  # follows symlinks: a ConfigMap volume's files are links
            except OSError:
                continue
            if not entry.is_file():
                continue
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            old = self._seen.get(entry.path)
            if old is not None and old[0] == stamp:
                seen[entry.path] = old
                continue
            seen[entry.path] = (stamp, self._read(Path(entry.path)))
        for gone in set(self._complained) - set(seen):
            del self._complained[gone]
        self._seen = seen
        return {s.name: s for _, s in seen.values() if s is not None}

    def take(self, specs: dict[str, PluginSpec]) -> None:
        if specs != self.specs:
            for name in sorted(set(self.specs) | set(specs)):
                old_spec, new_spec = self.specs.get(name), specs.get(name)
                if old_spec != new_spec:
                    what = "registered" if old_spec is None else "removed" if new_spec is None else "changed"
                    spec = new_spec or old_spec
                    assert spec is not None
                    log.info("hook plugin %s %s: %s, hooks %s, failure policy %s, timeout %gs", name, what,
                             spec.endpoint, ",".join(sorted(spec.hooks)) or "none", spec.failure_policy,
                             spec.timeout)
            self.specs = specs
            self.on_change(dict(specs))

    def _read(self, path: Path) -> PluginSpec | None:
        try:
            raw = path.read_bytes()
            spec = parse(path, raw.decode("utf-8"), self.default_timeout)
        except (OSError, UnicodeDecodeError, BadPlugin) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            if self._complained.get(str(path)) != reason:
                self._complained[str(path)] = reason
                log.error("hook plugin file %s ignored: %s", path, reason)
            return None
        self._complained.pop(str(path), None)
        return spec

    async def watch(self) -> None:
        """Keep the registrations current until cancelled."""
        while True:
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # e.g. out of inotify watches: try again shortly
                log.error("watching hook plugin directory %s failed (%s); retrying", self.directory, err)
                await asyncio.sleep(1.0)

    async def _watch_once(self) -> None:
        from asyncinotify import Inotify, Mask  # loaded only where a directory is watched

        with Inotify() as inotify:
            if not self.directory.is_dir():
                await self.rescan()
                await self._until_exists(inotify)
                return
            inotify.add_watch(self.directory, Mask.CREATE | Mask.CLOSE_WRITE | Mask.MODIFY | Mask.MOVED_TO
                              | Mask.MOVED_FROM | Mask.DELETE | Mask.ATTRIB | Mask.DELETE_SELF | Mask.MOVE_SELF)
            await self.rescan()
            while True:
                event = await inotify.get()
                gone = bool(event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED))
                while not gone:  # let a burst of events settle, then read once
                    try:
                        async with asyncio.timeout(SETTLE):
                            event = await inotify.get()
                    except TimeoutError:
                        break
                    gone = bool(event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED))
                await self.rescan()
                if gone or event.mask & Mask.Q_OVERFLOW and not self.directory.is_dir():
                    return  # watch again, from wherever the directory is now

    async def _until_exists(self, inotify: Inotify) -> None:
        """Wait for the directory to appear: watch the deepest ancestor that exists."""
        from asyncinotify import Mask

        parent = self.directory.parent
        while not parent.is_dir() and parent != parent.parent:
            parent = parent.parent
        inotify.add_watch(parent, Mask.CREATE | Mask.MOVED_TO | Mask.DELETE_SELF | Mask.MOVE_SELF)
        if self.directory.is_dir():
            return  # appeared while the watch was being set up
        await inotify.get()
