"""The CRI message dumper: each relayed call at the level its method's rules give
(resmgr.config.dumprules: off, short or full)."""

from __future__ import annotations

import logging
import os
import stat
import sys
import threading
import time
from typing import IO, Any

import yaml
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from resmgr.config.dumprules import DEFAULT_RULES, Level, RuleError, parse_rules
from resmgr.frontends.relay.methods import KNOWN, short_name

log = logging.getLogger("cri-resmgr.relay.dump")

__all__ = ["DEFAULT_RULES", "Dumper", "DumpSink", "Level", "RuleError", "parse_rules"]


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


class DumpSink:
    """Where the configuration's dumper goes: the dispatcher's CRI calls, if the daemon relays any."""

    def __init__(self, dispatcher: Any | None) -> None:
        self.dispatcher = dispatcher

    def open(self, rules: str, path: str | None) -> Dumper:
        return Dumper(rules, path)

    def use(self, dumper: Dumper) -> None:
        if self.dispatcher is None:  # no CRI messages to dump
            dumper.close()
            return
        old, self.dispatcher.dumper = self.dispatcher.dumper, dumper
        if old is not None:
            old.close()
