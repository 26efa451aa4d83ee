"""The gRPC relay front end: a generic grpc.aio handler that serves every method.

Pass-through calls are forwarded as raw bytes, never parsed. The caller's deadline
and metadata travel to the runtime; the runtime's status code, message, initial
and trailing metadata (so also rich error details) travel back unchanged. Calls the
Dispatcher wants (lifecycle, dumped) go through it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from resmgr import metrics
from resmgr.frontends.relay import memory
from resmgr.frontends.relay.dispatch import MAX_REQUEST, Dispatcher, name_socket
from resmgr.frontends.relay.methods import KNOWN, method_label

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


class Relay(grpc.GenericRpcHandler):
    """A generic gRPC handler that serves every method by relaying it."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    # grpc.GenericRpcHandler
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path = handler_call_details.method
        handler = self._handlers.get(path)
        if handler is None:
            handler = self._handlers[path] = self._build(path)
        return handler

    def _build(self, path: str) -> grpc.RpcMethodHandler:
        channel, socket = self.dispatcher.route(path)
        info = KNOWN.get(path)
        if self.dispatcher.wants(path):
            return grpc.unary_unary_rpc_method_handler(self._intercepted(path))
        if info is not None and not info.client_streaming and not info.server_streaming:
            return grpc.unary_unary_rpc_method_handler(self._unary(path, channel, socket))
        if info is not None and info.server_streaming and not info.client_streaming:
            return grpc.unary_stream_rpc_method_handler(self._unary_stream(path, channel, socket))
        # A method our schema does not know: relay it as a bidirectional stream of raw
        # messages, which carries every call shape on the wire.
        return grpc.stream_stream_rpc_method_handler(self._stream_stream(path, channel, socket))

    def _unary(self, path: str, channel: grpc.aio.Channel, socket: str) -> Behaviour:
        call_backend = channel.unary_unary(path)
        method = method_label(path)

        async def relay(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            started = time.perf_counter()
            call = call_backend(request, timeout=context.time_remaining(),
                                metadata=_forward_metadata(context))
            try:
                reply = await call
            except grpc.aio.AioRpcError as err:
                metrics.cri_call(method, "passthrough", err.code().name, time.perf_counter() - started)
                await _abort_like(name_socket(err, socket), context)
            metrics.cri_call(method, "passthrough", "OK", time.perf_counter() - started)
            await _reply_metadata(call, context)
            return reply

        return relay

    def _unary_stream(self, path: str, channel: grpc.aio.Channel, socket: str) -> Behaviour:
        call_backend = channel.unary_stream(path)

        async def relay(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            started = time.perf_counter()
            call = call_backend(request, timeout=context.time_remaining(),
                                metadata=_forward_metadata(context))
            try:
                initial = await call.initial_metadata()
                if initial:
                    await context.send_initial_metadata(tuple(initial))
                async for reply in call:
                    yield reply
            except grpc.aio.AioRpcError as err:
                metrics.cri_call(method_label(path), "passthrough", err.code().name, time.perf_counter() - started)
                await _abort_like(name_socket(err, socket), context)
            metrics.cri_call(method_label(path), "passthrough", "OK", time.perf_counter() - started)
            trailing = await call.trailing_metadata()
            if trailing:
                context.set_trailing_metadata(tuple(trailing))

        return relay

    def _stream_stream(self, path: str, channel: grpc.aio.Channel, socket: str) -> Behaviour:
        call_backend = channel.stream_stream(path)

        async def relay(requests: AsyncIterator[bytes],
                        context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            started = time.perf_counter()
            call = call_backend(requests, timeout=context.time_remaining(),
                                metadata=_forward_metadata(context))
            try:
                async for reply in call:
                    yield reply
            except grpc.aio.AioRpcError as err:
                metrics.cri_call(method_label(path), "passthrough", err.code().name, time.perf_counter() - started)
                await _abort_like(name_socket(err, socket), context)
            metrics.cri_call(method_label(path), "passthrough", "OK", time.perf_counter() - started)
            await _reply_metadata(call, context)

        return relay

    def _intercepted(self, path: str) -> Behaviour:
        dispatcher = self.dispatcher

        async def relay(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            if len(request) > MAX_REQUEST:
                memory.after_big_request()  # the aborted call's traceback holds the request
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    f"cri-resmgr: request larger than {MAX_REQUEST} bytes")
            out = await dispatcher.call(path, request, _forward_metadata(context), context.time_remaining())
            if out.initial:
                await context.send_initial_metadata(out.initial)
            if out.code != grpc.StatusCode.OK:
                await context.abort(out.code, out.details, out.trailing)
            if out.trailing:
                context.set_trailing_metadata(out.trailing)
            return out.reply

        return relay
