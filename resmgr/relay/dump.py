"""The CRI message dumper: per-method dump levels chosen by ordered regex rules.

Rules are `level:regexp` items separated by commas, applied in order so later
rules win; `reset` drops the rules before it. Levels: off, short (one line per
call), full (request and reply as YAML, with latency). A rule's regexp must match
the whole method name (e.g. CreateContainer).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import sys
import threading
import time
from enum import IntEnum
from typing import IO

import yaml
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from resmgr.relay.methods import KNOWN, short_name

log = logging.getLogger("cri-resmgr.relay.dump")

DEFAULT_RULES = "off:.*,short:((Create)|(Start)|(Run)|(Update)|(Stop)|(Remove)).*,off:.*Image.*"


class Level(IntEnum):
    OFF = 0
    SHORT = 1
    FULL = 2


class RuleError(ValueError):
    pass


def parse_rules(spec: str) -> list[tuple[Level, re.Pattern[str]]]:
    rules: list[tuple[Level, re.Pattern[str]]] = []
    # Split on commas that start a new `level:` item, so regexps may contain commas.
    items = re.split(r",(?=\s*(?:off|short|full|reset)\b)", spec.strip()) if spec.strip() else []
    for item in items:
        item = item.strip()
        if item == "reset":
            rules.clear()
            continue
        level, sep, pattern = item.partition(":")
        if not sep:
            raise RuleError(f"dump rule {item!r}: expected level:regexp (levels: off, short, full)")
        try:
            lvl = Level[level.strip().upper()]
        except KeyError:
            raise RuleError(f"dump rule {item!r}: unknown level {level!r} (use off, short or full)") from None
        try:
            rules.append((lvl, re.compile(pattern)))
        except re.error as err:
            raise RuleError(f"dump rule {item!r}: bad regexp: {err}") from None
    return rules


def _to_text(msg: Message | None, raw: bytes | None, cls: type[Message] | None) -> object:
    if msg is None and raw is not None:
        if cls is None:
            return f"<{len(raw)} bytes, unknown message type>"
        try:
            msg = cls.FromString(raw)
        except DecodeError:
            return f"<{len(raw)} bytes, does not parse as {cls.DESCRIPTOR.full_name}>"
    if msg is None:
        return None
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def _private_file(path: str) -> IO[str]:
    """The dump file, readable by its owner only: full dumps hold container environments (secrets)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
            os.fchmod(fd, 0o600)  # an older file made with a looser mode
        return os.fdopen(fd, "a", buffering=1)
    except BaseException:
        os.close(fd)
        raise


class Dumper:
    def __init__(self, rules: str = DEFAULT_RULES, path: str | None = None) -> None:
        self.rules = parse_rules(rules)
        self.spec = rules
        self._levels: dict[str, Level] = {}
        self._out: IO[str] | None = None
        self._out_lock = threading.Lock()
        if path:
            self._out = sys.stdout if path == "-" else _private_file(path)

    def level(self, path: str) -> Level:
        lvl = self._levels.get(path)
        if lvl is None:
            name = short_name(path)
            lvl = Level.OFF
            for rule_level, pattern in self.rules:
                if pattern.fullmatch(name):
                    lvl = rule_level
            self._levels[path] = lvl
        return lvl

    def _emit(self, text: str) -> None:
        if self._out is None:
            log.info("%s", text)
        else:
            with self._out_lock:
                self._out.write(text + "\n")

    def record(self, path: str, kind: str, started: float, *, request: Message | None = None,
               raw_request: bytes | None = None, reply: Message | None = None,
               raw_reply: bytes | None = None, error: tuple[str, str] | None = None) -> None:
        """Dump one finished call. kind is 'intercepted' or 'passthrough'."""
        lvl = self.level(path)
        if lvl == Level.OFF:
            return
        latency_ms = (time.perf_counter() - started) * 1000
        name = short_name(path)
        outcome = f"error {error[0]}: {error[1]}" if error else "ok"
        if lvl == Level.SHORT:
            self._emit(f"{kind} {name} {outcome} ({latency_ms:.3f} ms)")
            return
        info = KNOWN.get(path)
        doc = {
            "method": path,
            "kind": kind,
            "latency_ms": round(latency_ms, 3),
            "request": _to_text(request, raw_request, info.request if info else None),
        }
        if error:
            doc["error"] = {"code": error[0], "message": error[1]}
        else:
            doc["reply"] = _to_text(reply, raw_reply, info.response if info else None)
        self._emit("---\n" + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False).rstrip())

    def close(self) -> None:
        if self._out is not None and self._out is not sys.stdout:
            self._out.close()
