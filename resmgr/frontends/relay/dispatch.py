"""The relay's dispatcher: calls it handles itself rather than passing through as bytes.

Lifecycle calls go to the engine, which performs the runtime call through `send`;
pass-through unary calls that the dumper wants to see are forwarded here too, so
they can be parsed. Both relay front ends (gRPC and splice) use this.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError, Message

from resmgr import metrics
from resmgr.engine import Engine
from resmgr.engine.calls import HookPoints
from resmgr.frontends import errors
from resmgr.frontends.cri import protowire
from resmgr.frontends.cri.lifecycle import CriLifecycle
from resmgr.frontends.relay import memory
from resmgr.frontends.relay.dump import Dumper, Level
from resmgr.frontends.relay.methods import KNOWN, is_image_method, method_label, short_name

log = logging.getLogger("cri-resmgr.relay")

# The largest request the relay reads for a call it answers: containerd's own receive limit,
# and kubelet sends no more. Anything bigger would be refused by the runtime anyway.
MAX_REQUEST = 16 << 20

# How gRPC itself words a failure to reach the backend (as opposed to the runtime's own errors).
_TRANSPORT_FAILURES = ("failed to connect to all addresses", "Socket closed", "Connection reset",
                       "Broken pipe", "connections to all backends failing")


def name_socket(err: grpc.aio.AioRpcError, socket: str) -> grpc.aio.AioRpcError:
    """Make a failure to reach the runtime say which socket could not be reached."""
    details = err.details() or ""
    if err.code() != grpc.StatusCode.UNAVAILABLE or not socket or socket in details \
            or not details.startswith(_TRANSPORT_FAILURES):
        return err
    return grpc.aio.AioRpcError(err.code(), err.initial_metadata(), err.trailing_metadata(),
                                details=f"runtime socket {socket} unavailable: {details}",
                                debug_error_string=err.debug_error_string())


@dataclass
class Outcome:
    """How a call ended, ready to be written back in either front end's terms."""

    code: grpc.StatusCode
    details: str = ""
    reply: bytes | None = None
    initial: tuple = ()
    trailing: tuple = ()


class Dispatcher:
    """Routes each call: lifecycle calls to the engine (through the CRI front end), dumped unary
    calls through a parse-and-forward, and tells the front ends which calls stay bytes."""

    def __init__(self, engine: Engine | None, runtime_channel: grpc.aio.Channel,
                 image_channel: grpc.aio.Channel, dumper: Dumper | None = None,
                 runtime_socket: str = "", image_socket: str = "", hooks: HookPoints | None = None) -> None:
        self.engine_calls = CriLifecycle(engine, hooks).handlers() if engine is not None else {}
        self.channels = (runtime_channel, image_channel)
        self.sockets = (runtime_socket, image_socket or runtime_socket)
        self.dumper = dumper
        self._typed: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}
        self._raw: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}

    def route(self, path: str) -> tuple[grpc.aio.Channel, str]:
        i = 1 if is_image_method(path) else 0
        return self.channels[i], self.sockets[i]

    def dumped(self, path: str) -> bool:
        return self.dumper is not None and self.dumper.level(path) != Level.OFF

    def wants(self, path: str) -> bool:
        """Whether the call must be handled here (intercepted, or a dumped unary call)."""
        if path in self.engine_calls:
            return True
        info = KNOWN.get(path)
        return info is not None and not info.server_streaming and not info.client_streaming \
            and self.dumped(path)

    async def call(self, path: str, request: bytes, metadata: tuple | None,
                   timeout: float | None) -> Outcome:
        started = time.perf_counter()
        if len(request) >= memory.BIG:
            memory.after_big_request()
        engine_call = self.engine_calls.get(path)
        msg = None
        if engine_call is not None:
            try:
                msg = KNOWN[path].request.FromString(request)
            except DecodeError:
                # Never let the runtime act on what the engine did not see.
                outcome = Outcome(grpc.StatusCode.INVALID_ARGUMENT, f"cri-resmgr: {_unreadable(path, request)}")
                log.error("%s refused: %s", path, outcome.details)
                if self.dumped(path):
                    self._dump(path, started, "intercepted", None, request, outcome)
                metrics.cri_call(method_label(path), "engine", outcome.code.name, time.perf_counter() - started)
                return outcome
        if engine_call is None:
            outcome = await self._forward_raw(path, request, metadata, timeout)
            if self.dumped(path):
                self._dump(path, started, "passthrough", None, request, outcome)
            metrics.cri_call(method_label(path), "relayed", outcome.code.name, time.perf_counter() - started)
            return outcome
        calls: list[grpc.aio.Call] = []
        channel, socket = self.route(path)
        info = KNOWN[path]
        typed = self._typed.get(path)
        if typed is None:
            typed = self._typed[path] = channel.unary_unary(path, request_serializer=info.request.SerializeToString)

        async def send(m: Message) -> Message:
            call = typed(m, timeout=timeout, metadata=metadata)
            calls.append(call)
            try:
                raw = await call
            except grpc.aio.AioRpcError as err:
                raise name_socket(err, socket) from None
            try:
                return protowire.parse(info.response, raw)[0]
            except DecodeError as err:  # the runtime did act: INTERNAL makes the engine check what it did
                details = f"runtime reply to {short_name(path)} does not parse: {err}"
                raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                           details=details) from None

        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            reply = await engine_call(msg, send, deadline)
            outcome = Outcome(grpc.StatusCode.OK, reply=reply.SerializeToString())
            if calls:
                outcome.initial = tuple(await calls[-1].initial_metadata() or ())
                outcome.trailing = tuple(await calls[-1].trailing_metadata() or ())
        except grpc.aio.AioRpcError as err:
            outcome = _failed(err)
            log.info("%s failed in the runtime: %s: %s", path, err.code().name, err.details())
        except asyncio.CancelledError:
            log.warning("%s cancelled by the caller after %.3fs", path, time.perf_counter() - started)
            metrics.cri_call(method_label(path), "engine", "CANCELLED", time.perf_counter() - started)
            raise
        except Exception as err:
            refused = errors.refusal(err)
            if refused is None:
                log.exception("%s failed in the resource manager", path)
                outcome = Outcome(grpc.StatusCode.INTERNAL, f"cri-resmgr: {path}: {err}")
            else:
                code, level = refused
                if level is not None:
                    log.log(level, "%s refused: %s", path, err)
                outcome = Outcome(grpc.StatusCode[code], f"cri-resmgr: {err}")
        if self.dumped(path):
            self._dump(path, started, "intercepted", msg, request, outcome)
        metrics.cri_call(method_label(path), "engine", outcome.code.name, time.perf_counter() - started)
        return outcome

    async def _forward_raw(self, path: str, request: bytes, metadata: tuple | None,
                           timeout: float | None) -> Outcome:
        channel, socket = self.route(path)
        raw = self._raw.get(path)
        if raw is None:
            raw = self._raw[path] = channel.unary_unary(path)
        call = raw(request, timeout=timeout, metadata=metadata)
        try:
            reply = await call
        except grpc.aio.AioRpcError as err:
            return _failed(name_socket(err, socket))
        return Outcome(grpc.StatusCode.OK, reply=reply, initial=tuple(await call.initial_metadata() or ()),
                       trailing=tuple(await call.trailing_metadata() or ()))

    def _dump(self, path: str, started: float, kind: str, msg: Message | None, raw: bytes,
              outcome: Outcome) -> None:
        assert self.dumper is not None
        error = None if outcome.code == grpc.StatusCode.OK else (outcome.code.name, outcome.details)
        self.dumper.record(path, kind, started, request=msg, raw_request=None if msg else raw,
                           raw_reply=outcome.reply, error=error)


def _unreadable(path: str, request: bytes) -> str:
    """Why an intercepted request cannot be read, naming the fields where that is known."""
    name = short_name(path)
    try:
        bad = protowire.invalid_strings(KNOWN[path].request, request)
    except DecodeError as err:
        return f"{name} request is not a valid protobuf message: {err}"
    if bad:
        return f"{name} request has text that is not UTF-8 in {', '.join(bad[:5])}"
    return f"{name} request does not parse as {KNOWN[path].request.DESCRIPTOR.full_name}"


def _failed(err: grpc.aio.AioRpcError) -> Outcome:
    return Outcome(err.code(), err.details() or "", initial=tuple(err.initial_metadata() or ()),
                   trailing=tuple(err.trailing_metadata() or ()))
