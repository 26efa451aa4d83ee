"""Relay CRI calls to the runtime: raw bytes for pass-through, the engine for lifecycle.

Pass-through calls are forwarded without parsing (only the dumper parses, when asked).
The caller's deadline and metadata travel to the runtime; the runtime's status
code, message, initial and trailing metadata (so also rich error details) travel
back unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from resmgr.dump import Dumper, Level
from resmgr.engine import Engine
from resmgr.relay.methods import KNOWN, is_image_method

log = logging.getLogger("cri-resmgr.relay")

MAX_MESSAGE_SIZE = 64 * 1024 * 1024  # kubelet uses 16 MiB; never be the smaller limit

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
    ("grpc.max_receive_message_length", MAX_MESSAGE_SIZE),
    # Reconnect quickly once the runtime is back instead of backing off for minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]

SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
    ("grpc.max_receive_message_length", MAX_MESSAGE_SIZE),
]

# Request metadata that gRPC itself owns; everything else is the caller's to forward.
_OWN_METADATA = frozenset({"user-agent", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout",
                           "content-type", "te"})

Behaviour = Callable[..., Any]


def _forward_metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, Any], ...] | None:
    md = context.invocation_metadata()
    if not md:
        return None
    out = tuple((k, v) for k, v in md if k not in _OWN_METADATA and not k.startswith(":"))
    return out or None


async def _reply_metadata(call: grpc.aio.Call, context: grpc.aio.ServicerContext) -> None:
    initial = await call.initial_metadata()
    if initial:
        await context.send_initial_metadata(tuple(initial))
    trailing = await call.trailing_metadata()
    if trailing:
        context.set_trailing_metadata(tuple(trailing))


async def _abort_like(err: grpc.aio.AioRpcError, context: grpc.aio.ServicerContext) -> None:
    """Finish the call with exactly the runtime's status (raises)."""
    initial = err.initial_metadata()
    if initial:
        try:
            await context.send_initial_metadata(tuple(initial))
        except Exception:  # already sent, or the call is gone
            pass
    await context.abort(err.code(), err.details() or "", tuple(err.trailing_metadata() or ()))


class RuntimeUnavailable(Exception):
    pass


class Relay(grpc.GenericRpcHandler):
    """A generic gRPC handler that serves every method by relaying it."""

    def __init__(self, runtime_channel: grpc.aio.Channel, image_channel: grpc.aio.Channel,
                 engine: Engine | None, dumper: Dumper | None = None,
                 runtime_socket: str = "", image_socket: str = "") -> None:
        self.runtime = runtime_channel
        self.images = image_channel
        self.engine = engine
        self.dumper = dumper
        self.sockets = (runtime_socket, image_socket or runtime_socket)
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._intercepts: dict[str, Callable[..., Awaitable[Message]]] = {}
        if engine is not None:
            base = "/runtime.v1.RuntimeService/"
            self._intercepts = {
                base + "RunPodSandbox": engine.run_pod_sandbox,
                base + "StopPodSandbox": engine.stop_pod_sandbox,
                base + "RemovePodSandbox": engine.remove_pod_sandbox,
                base + "CreateContainer": engine.create_container,
                base + "StartContainer": engine.start_container,
                base + "UpdateContainerResources": engine.update_container_resources,
                base + "StopContainer": engine.stop_container,
                base + "RemoveContainer": engine.remove_container,
            }

    def set_dumper(self, dumper: Dumper | None) -> None:
        self.dumper = dumper
        self._handlers.clear()

    # grpc.GenericRpcHandler
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path = handler_call_details.method
        handler = self._handlers.get(path)
        if handler is None:
            handler = self._handlers[path] = self._build(path)
        return handler

    def _channel_for(self, path: str) -> tuple[grpc.aio.Channel, str]:
        if is_image_method(path):
            return self.images, self.sockets[1]
        return self.runtime, self.sockets[0]

    def _build(self, path: str) -> grpc.RpcMethodHandler:
        channel, socket = self._channel_for(path)
        info = KNOWN.get(path)
        level = self.dumper.level(path) if self.dumper else Level.OFF
        if path in self._intercepts:
            return grpc.unary_unary_rpc_method_handler(
                self._intercepted(path, self._intercepts[path], channel, socket))
        if info is not None and not info.client_streaming and not info.server_streaming:
            return grpc.unary_unary_rpc_method_handler(self._unary(path, channel, socket, level))
        if info is not None and info.server_streaming and not info.client_streaming:
            return grpc.unary_stream_rpc_method_handler(self._unary_stream(path, channel, socket))
        # A method our schema does not know: relay it as a bidirectional stream of raw
        # messages, which carries every call shape on the wire.
        return grpc.stream_stream_rpc_method_handler(self._stream_stream(path, channel, socket))

    # -- pass-through --------------------------------------------------------------
    def _unary(self, path: str, channel: grpc.aio.Channel, socket: str, level: Level) -> Behaviour:
        call_backend = channel.unary_unary(path)
        dumper = self.dumper

        async def relay(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            call = call_backend(request, timeout=context.time_remaining(),
                                metadata=_forward_metadata(context))
            try:
                reply = await call
            except grpc.aio.AioRpcError as err:
                await _abort_like(_name_socket(err, socket), context)
            await _reply_metadata(call, context)
            return reply

        if level == Level.OFF or dumper is None:
            return relay

        async def relay_dumped(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            started = time.perf_counter()
            try:
                reply = await relay(request, context)
            except BaseException:
                dumper.record(path, "passthrough", started, raw_request=request,
                              error=(context.code().name if context.code() else "UNKNOWN",
                                     context.details() or ""))
                raise
            dumper.record(path, "passthrough", started, raw_request=request, raw_reply=reply)
            return reply

        return relay_dumped

    def _unary_stream(self, path: str, channel: grpc.aio.Channel, socket: str) -> Behaviour:
        call_backend = channel.unary_stream(path)

        async def relay(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            call = call_backend(request, timeout=context.time_remaining(),
                                metadata=_forward_metadata(context))
            try:
                initial = await call.initial_metadata()
                if initial:
                    await context.send_initial_metadata(tuple(initial))
                async for reply in call:
                    yield reply
            except grpc.aio.AioRpcError as err:
                await _abort_like(_name_socket(err, socket), context)
            trailing = await call.trailing_metadata()
            if trailing:
                context.set_trailing_metadata(tuple(trailing))

        return relay

    def _stream_stream(self, path: str, channel: grpc.aio.Channel, socket: str) -> Behaviour:
        call_backend = channel.stream_stream(path)

        async def relay(requests: AsyncIterator[bytes],
                        context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            call = call_backend(requests, timeout=context.time_remaining(),
                                metadata=_forward_metadata(context))
            try:
                async for reply in call:
                    yield reply
            except grpc.aio.AioRpcError as err:
                await _abort_like(_name_socket(err, socket), context)
            await _reply_metadata(call, context)

        return relay

    # -- intercepted -----------------------------------------------------------------
    def _intercepted(self, path: str, engine_call: Callable[..., Awaitable[Message]],
                     channel: grpc.aio.Channel, socket: str) -> Behaviour:
        info = KNOWN[path]
        call_backend = channel.unary_unary(path, request_serializer=info.request.SerializeToString,
                                           response_deserializer=info.response.FromString)

        async def relay(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            started = time.perf_counter()
            calls: list[grpc.aio.Call] = []

            async def send(msg: Message) -> Message:
                call = call_backend(msg, timeout=context.time_remaining(),
                                    metadata=_forward_metadata(context))
                calls.append(call)
                try:
                    return await call
                except grpc.aio.AioRpcError as err:
                    raise _name_socket(err, socket) from None

            try:
                msg = info.request.FromString(request)
            except DecodeError:
                # Not ours to judge: let the runtime answer a request it cannot parse either.
                msg = None
            try:
                if msg is None:
                    reply_bytes = await self._unary(path, channel, socket, Level.OFF)(request, context)
                    return reply_bytes
                reply = await engine_call(msg, send)
            except grpc.aio.AioRpcError as err:
                self._dump(path, started, msg, None, (err.code().name, err.details() or ""))
                await _abort_like(err, context)
            except Exception as err:
                log.exception("%s failed in the resource manager", path)
                self._dump(path, started, msg, None, ("INTERNAL", str(err)))
                await context.abort(grpc.StatusCode.INTERNAL, f"cri-resmgr: {path}: {err}")
            if calls:
                await _reply_metadata(calls[-1], context)
            self._dump(path, started, msg, reply, None)
            return reply.SerializeToString()

        return relay

    def _dump(self, path: str, started: float, request: Message | None, reply: Message | None,
              error: tuple[str, str] | None) -> None:
        if self.dumper is not None and self.dumper.level(path) != Level.OFF:
            self.dumper.record(path, "intercepted", started, request=request, reply=reply, error=error)


# How gRPC itself words a failure to reach the backend (as opposed to the runtime's own errors).
_TRANSPORT_FAILURES = ("failed to connect to all addresses", "Socket closed", "Connection reset",
                       "Broken pipe", "connections to all backends failing")


def _name_socket(err: grpc.aio.AioRpcError, socket: str) -> grpc.aio.AioRpcError:
    """Make a failure to reach the runtime say which socket could not be reached."""
    details = err.details() or ""
    if err.code() != grpc.StatusCode.UNAVAILABLE or not socket or socket in details \
            or not details.startswith(_TRANSPORT_FAILURES):
        return err
    return grpc.aio.AioRpcError(err.code(), err.initial_metadata(), err.trailing_metadata(),
                                details=f"runtime socket {socket} unavailable: {details}",
                                debug_error_string=err.debug_error_string())
