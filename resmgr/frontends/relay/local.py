"""Calls the relay answers itself: collected, handed to the Dispatcher, answered on the same stream.

The request is held (within the connection's and all connections' budgets) until it is
complete; a call over budget or over MAX_REQUEST is answered RESOURCE_EXHAUSTED and the
client is asked to stop sending it. The answer's header blocks never touch the client's
HPACK decoder table. Streams answered here that ended are remembered for a while, so late
frames for them never reach the runtime, which never saw the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from resmgr.frontends.relay import frames as h2
from resmgr.frontends.relay.dispatch import MAX_REQUEST, Dispatcher, Outcome
from resmgr.frontends.relay.writer import Budget, ClientWriter

MAX_LOCAL_STREAMS = 1000  # calls answered here open at once on one connection
STREAM_COST = 512  # bookkeeping of one call, counted against the budgets
DONE_REMEMBERED = 1024  # ended streams whose late frames are still dropped
_GRPC_OWN = frozenset({b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding",
                       b"user-agent"})
REPLY_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


class Call:
    """A call answered by the relay itself."""

    __slots__ = ("sid", "path", "headers", "body", "task", "held")

    def __init__(self, sid: int, path: str, headers: list[tuple[bytes, bytes]]) -> None:
        self.sid = sid
        self.path = path
        self.headers = headers
        self.body = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.held = 0  # bytes of the budgets this call holds


class LocalCalls:
    """One connection's calls answered here."""

    def __init__(self, dispatcher: Dispatcher, writer: ClientWriter, budget: Budget,
                 failed: Callable[[], str | None], after_failure: Callable[[], None],
                 ended: Callable[[], None]) -> None:
        self.dispatcher = dispatcher
        self.writer = writer
        self.budget = budget
        self.failed = failed  # why the runtime is unreachable (every call is answered here), or None
        self.after_failure = after_failure  # an answer of that kind went out
        self.ended = ended  # a call ended (someone may wait for the connection to go quiet)
        self.calls: dict[int, Call] = {}
        self.done: dict[int, None] = {}
        self.closed = False

    def begin(self, sid: int, path: str, headers: list[tuple[bytes, bytes]], end_stream: bool,
              header_bytes: int, window: int) -> None:
        """A new call to answer here (its header block has ended)."""
        call = self.calls[sid] = Call(sid, path, headers)
        self.writer.swin[sid] = window
        if len(self.calls) > MAX_LOCAL_STREAMS:
            self.end(sid)
            self.writer.swin.pop(sid, None)
            self.writer.inject(h2.rst_stream(sid, h2.REFUSED_STREAM))
            return
        if not self._hold(call, STREAM_COST + header_bytes):
            self._refuse(sid, call, "too many requests held at once; try again")
            return
        if end_stream:
            self.complete(call)

    def data(self, sid: int, flags: int, payload: bytes, flow: int) -> None:
        """DATA of a call answered here (or of any call while the runtime is unreachable)."""
        if flow:  # consumed here: give the client its window back
            credit = h2.window_update(0, flow)
            if sid in self.calls and not flags & h2.END_STREAM:
                credit += h2.window_update(sid, flow)
            self.writer.inject(credit)
        call = self.calls.get(sid)
        if call is None:
            return
        data = h2.unpad(flags, payload)
        if len(call.body) + len(data) > MAX_REQUEST + 5:
            self._refuse(sid, call, f"request larger than {MAX_REQUEST} bytes")
            return
        if not self._hold(call, len(data)):
            self._refuse(sid, call, "too many request bytes held at once; try again")
            return
        call.body += data
        if flags & h2.END_STREAM:
            self.complete(call)

    def complete(self, call: Call) -> None:
        """The request is in: answer it."""
        if call.task is None:
            call.task = asyncio.ensure_future(self._run(call))

    def reset(self, sid: int) -> bool:
        """The client reset stream sid; whether it was one of ours (nothing of it goes to the runtime)."""
        call = self.end(sid)
        if call is None and sid not in self.done:
            return False
        if call is not None and call.task is not None:
            call.task.cancel()
        self.writer.drop(sid)
        return True

    def end(self, sid: int) -> Call | None:
        call = self.calls.pop(sid, None)
        if call is not None:
            self.remember(sid)
            if call.task is None:  # never started: nothing will give its bytes back
                self._unhold(call)
            self.ended()
        return call

    def remember(self, sid: int) -> None:
        """A stream the runtime never saw has ended: late frames for it stay here."""
        self.done[sid] = None
        if len(self.done) > DONE_REMEMBERED:
            del self.done[next(iter(self.done))]

    def close(self) -> None:
        """The connection is gone: every call is cancelled and gives its bytes back."""
        self.closed = True
        for call in self.calls.values():
            if call.task is not None:
                call.task.cancel()
            self._unhold(call)
        self.calls.clear()

    # -- budgets ---------------------------------------------------------------------------
    def _hold(self, call: Call, n: int) -> bool:
        """Hold n more bytes for call, if the budgets allow."""
        if not self.budget.allows(n):
            return False
        call.held += n
        self.budget.charge(n)
        return True

    def _unhold(self, call: Call) -> None:
        self.budget.charge(-call.held)
        call.held = 0

    def _refuse(self, sid: int, call: Call, why: str) -> None:
        """Answer a call whose request we will not hold, and ask the client to stop sending it."""
        self.end(sid)
        call.body = bytearray()
        self.answer(sid, Outcome(grpc.StatusCode.RESOURCE_EXHAUSTED, f"cri-resmgr: {why}"))
        self.writer.inject(h2.rst_stream(sid, h2.NO_ERROR))
        self.writer.drain()

    # -- answering -------------------------------------------------------------------------
    async def _run(self, call: Call) -> None:
        sid = call.sid
        try:
            outcome = await self._outcome(call)
        finally:
            self._unhold(call)
        if self.closed or self.end(sid) is None:
            return  # the client went away or cancelled the call
        self.answer(sid, outcome)
        if self.failed() is not None:
            self.after_failure()  # new calls should come on a new connection, which tries the runtime again

    async def _outcome(self, call: Call) -> Outcome:
        body, call.body = call.body, bytearray()
        failed = self.failed()
        if failed is not None:  # answered once the whole request is in, like a server would
            return Outcome(grpc.StatusCode.UNAVAILABLE, failed)
        if len(body) < 5 or int.from_bytes(body[1:5], "big") != len(body) - 5:
            return Outcome(grpc.StatusCode.INTERNAL, "malformed gRPC request framing")
        if body[0] != 0:
            return Outcome(grpc.StatusCode.UNIMPLEMENTED, "compressed requests are not supported")
        timeout = next((h2.grpc_timeout(v) for k, v in call.headers if k == b"grpc-timeout"), None)
        metadata = h2.headers_to_metadata(call.headers, _GRPC_OWN)
        request = bytes(memoryview(body)[5:])
        body.clear()  # one copy of a big request at a time
        return await self.dispatcher.call(call.path, request, metadata or None, timeout)

    def answer(self, sid: int, outcome: Outcome) -> None:
        w = self.writer
        initial = REPLY_HEADERS + h2.metadata_to_headers(outcome.initial)
        # grpc-message always, empty when there is none, as gRPC's Go server writes it.
        trailer = [(b"grpc-status", str(outcome.code.value[0]).encode()),
                   (b"grpc-message", h2.percent_encode(outcome.details))]
        trailer += h2.metadata_to_headers(outcome.trailing)
        if outcome.code != grpc.StatusCode.OK or outcome.reply is None:
            w.inject(h2.header_frames(sid, h2.encode_headers(initial + trailer), True), 0, -sid)
        else:
            w.inject(h2.header_frames(sid, h2.encode_headers(initial), False))
            data = h2.grpc_message(outcome.reply)
            for i in range(0, len(data), h2.DEFAULT_MAX_FRAME):
                chunk = data[i:i + h2.DEFAULT_MAX_FRAME]
                w.inject(h2.frame(h2.DATA, 0, sid, chunk), len(chunk), sid)
            w.inject(h2.header_frames(sid, h2.encode_headers(trailer), True), 0, -sid)
        w.drain()
