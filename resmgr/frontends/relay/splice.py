"""The splicing relay front end: HTTP/2 frames forwarded between paired connections.

Each client connection (kubelet's) gets its own connection to the runtime, and frames
pass through verbatim, parsed no further than their 9-byte header, except:

- the client's header blocks are decoded (HPACK) to learn each call's method and are
  re-encoded without the dynamic table toward the runtime, so calls answered here can
  be left out without the runtime's decoder state drifting from the client's encoder;
- calls the Dispatcher wants (lifecycle calls, dumped calls) are answered here: the
  request is collected, handed to the Dispatcher, and the reply is written back on the
  same stream with header blocks that do not touch the client's decoder table;
- the connection flow-control window toward the client is enforced here, because the
  relay adds bytes the runtime does not know about.

Memory is bounded against hostile clients: a header block may hold at most 1 MiB (more
is a connection error, as in Go's HTTP/2 server), a frame no more than the runtime
advertised, a request answered here at most MAX_REQUEST bytes, and the bytes held for
calls answered here are budgeted per connection and in all (a call over budget gets
RESOURCE_EXHAUSTED; other calls go on). Each direction stops reading when the other
side's socket does not drain.

Why not grpc.aio on both sides: on 2-core VMs grpc.aio spends about 1 ms of CPU per
relayed call in thread hand-offs; splicing frames in one event loop costs about 0.1 ms.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

import grpc
import hpack
from hpack.exceptions import HPACKError

from resmgr import metrics
from resmgr.frontends.relay import frames as h2
from resmgr.frontends.relay.dispatch import MAX_REQUEST, Dispatcher, Outcome
from resmgr.frontends.relay.methods import is_image_method
from resmgr.frontends.relay.tally import Tally

log = logging.getLogger("cri-resmgr.relay")

MAX_HEADER_BLOCK = 1 << 20  # bytes of one header block, compressed or decoded
HELD_PER_CONNECTION = 64 << 20  # request and reply bytes held for calls answered here
HELD_IN_ALL = 128 << 20
MAX_LOCAL_STREAMS = 1000  # calls answered here open at once on one connection
MAX_UNREAD = 16 << 20  # bytes a client may leave unread before it is cut off
STREAM_COST = 512  # bookkeeping of one call, counted against the budgets
COMPRESSION_ERROR = 0x9
_GRPC_OWN = frozenset({b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding",
                       b"user-agent"})
_REPLY_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


class SpliceServer:
    def __init__(self, dispatcher: Dispatcher, runtime_socket: str, image_socket: str = "") -> None:
        self.dispatcher = dispatcher
        self.runtime_socket = runtime_socket
        # Two backends cannot share one client connection's HPACK context; image calls to a
        # separate image socket are therefore answered here, through the Dispatcher.
        self.split_images = bool(image_socket) and image_socket != runtime_socket
        self.conns: set[_Conn] = set()
        self.held = 0  # bytes held for calls answered here, all connections
        self._local: dict[str, bool] = {}
        self._server: asyncio.AbstractServer | None = None

    def local_route(self, path: str) -> bool:
        local = self._local.get(path)
        if local is None:
            local = self._local[path] = self.dispatcher.wants(path) or (
                self.split_images and is_image_method(path))
        return local

    async def start(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Conn(self), path)

    async def stop(self, grace: float) -> None:
        """Stop accepting, tell clients to open no new calls, let open calls finish."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.conns):
            conn.goaway()
        deadline = time.monotonic() + grace
        while any(c.busy() for c in self.conns) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.conns):
            conn.close()


class _Local:
    """A call answered by the relay itself."""

    __slots__ = ("path", "headers", "body", "task", "held")

    def __init__(self, path: str, headers: list[tuple[bytes, bytes]]) -> None:
        self.path = path
        self.headers = headers
        self.body = bytearray()
        self.task: asyncio.Task | None = None
        self.held = 0  # bytes of the budgets this call holds


class _Calm(Exception):
    """A client asking for more than the relay will hold: a connection error."""


class _Backend(asyncio.Protocol):
    def __init__(self, conn: _Conn) -> None:
        self.conn = conn
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.conn.on_backend(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.backend_lost()

    # The runtime does not read: stop reading from the client until it does.
    def pause_writing(self) -> None:
        _reading(self.conn.transport, False)

    def resume_writing(self) -> None:
        _reading(self.conn.transport, True)


def _reading(transport: asyncio.Transport | None, on: bool) -> None:
    if transport is not None and not transport.is_closing():
        (transport.resume_reading if on else transport.pause_reading)()


class _Conn(asyncio.Protocol):
    """One client connection and its paired runtime connection."""

    def __init__(self, server: SpliceServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.backend: _Backend | None = None
        self.failed: str | None = None  # runtime unreachable: answer every call here
        self.closed = False
        # client -> runtime
        self.cin = bytearray()
        self.preface = False
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = MAX_HEADER_BLOCK
        self.hdr_stream = 0
        self.hdr_flags = 0
        self.hdr_buf = bytearray()
        self.last_stream = 0
        self.refuse_after: int | None = None
        self.local: dict[int, _Local] = {}
        # Streams answered here that have ended: late frames for them must not reach the
        # runtime, which never saw the stream (an idle-stream frame is a connection error there).
        self.local_done: dict[int, None] = {}
        self.open: dict[int, bool] = {}  # pass-through calls in flight -> runtime sent headers
        # runtime -> client
        self.bin = bytearray()
        self.back_hdr_open = False
        self.back_ready = False  # the runtime's SETTINGS must be the first frame the client sees
        self.out: deque[tuple[bytes, int, int]] = deque()  # (bytes, flow-controlled length, stream)
        self.parked: list[tuple[bytes, int, int]] = []  # our frames waiting for a header block to end
        self.cwin = h2.DEFAULT_WINDOW  # the client's connection receive window, as it really is
        self.debt = 0  # bytes we sent that the runtime still counts as window
        self.swin: dict[int, int] = {}  # the client's receive windows of streams we answer
        self.client_initial_window = h2.DEFAULT_WINDOW
        self.max_frame = h2.DEFAULT_MAX_FRAME  # what the runtime accepts, so the client may send
        self.held = 0  # bytes held for calls answered here
        self.queued: dict[int, int] = {}  # reply bytes of streams we answer, not yet written
        self.tally = Tally() if metrics.enabled else None

    # -- client side ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.conns.add(self)
        asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        path = self.server.runtime_socket
        try:
            _, self.backend = await loop.create_unix_connection(lambda: _Backend(self), path)
        except OSError as err:
            self.failed = f"runtime socket {path} unavailable: {err.strerror or err}"
            log.debug("%s", self.failed)
            if not self.closed:
                self.transport.write(h2.frame(h2.SETTINGS, 0, 0))
            self.back_ready = True
        if self.closed:
            if self.backend is not None and self.backend.transport is not None:
                self.backend.transport.close()
            return
        self._on_client()

    def data_received(self, data: bytes) -> None:
        self.cin += data
        if self.backend is not None or self.failed is not None:
            self._on_client()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.conns.discard(self)
        for ls in self.local.values():
            if ls.task is not None:
                ls.task.cancel()
            self._unhold(ls)
        self.local.clear()
        # Nothing of this connection's may outlive it, even if a reference cycle keeps it a while.
        self.cin, self.bin, self.hdr_buf = bytearray(), bytearray(), bytearray()
        self.out.clear()
        self.parked.clear()
        self._charge(-sum(self.queued.values()))
        self.queued.clear()
        if self.backend is not None and self.backend.transport is not None:
            self.backend.transport.close()

    # The client does not read: stop reading from the runtime until it does.
    def pause_writing(self) -> None:
        if self.backend is not None:
            _reading(self.backend.transport, False)

    def resume_writing(self) -> None:
        if self.backend is not None:
            _reading(self.backend.transport, True)

    # -- budgets -------------------------------------------------------------------------
    def _charge(self, n: int) -> None:
        """Count n more bytes (fewer, if negative) held by this connection, and in all."""
        self.held += n
        self.server.held += n

    def _hold(self, ls: _Local, n: int) -> bool:
        """Hold n more bytes for ls, if the budgets allow."""
        if self.held + n > HELD_PER_CONNECTION or self.server.held + n > HELD_IN_ALL:
            return False
        ls.held += n
        self._charge(n)
        return True

    def _unhold(self, ls: _Local) -> None:
        self._charge(-ls.held)
        ls.held = 0

    def _on_client(self) -> None:
        buf = self.cin
        pos = 0
        out: list[bytes] = []
        if not self.preface:
            if len(buf) < len(h2.PREFACE):
                return
            if bytes(buf[:len(h2.PREFACE)]) != h2.PREFACE:
                log.warning("client connection without the HTTP/2 preface; closing it")
                self.transport.close()
                return
            self.preface = True
            pos = len(h2.PREFACE)
            if self.failed is None:
                out.append(h2.PREFACE)
        consumed = pos
        try:
            for at, end, ftype, flags in h2.split_frames(buf, pos):
                length = end - at - 9
                sid = int.from_bytes(buf[at + 5:at + 9], "big") & 0x7FFFFFFF
                if sid in self.local_done and ftype != h2.HEADERS and ftype != h2.CONTINUATION \
                        and sid not in self.swin:  # a reply still being sent needs its window updates
                    if ftype == h2.DATA and length:
                        self._inject(h2.window_update(0, length))  # still counts on the connection
                elif ftype == h2.DATA:
                    if sid in self.local or self.failed is not None:
                        self._local_data(sid, flags, bytes(buf[at + 9:end]), length)
                    else:
                        out.append(buf[at:end])
                elif ftype == h2.HEADERS or ftype == h2.CONTINUATION:
                    self._header_fragment(ftype, flags, sid, bytes(buf[at + 9:end]), out)
                elif ftype == h2.WINDOW_UPDATE:
                    self._client_window_update(sid, int.from_bytes(buf[at + 9:at + 13], "big") & 0x7FFFFFFF,
                                               buf[at:end], out)
                elif ftype == h2.SETTINGS:
                    if not flags & h2.ACK:
                        settings = h2.parse_settings(bytes(buf[at + 9:end]))
                        self.client_initial_window = settings.get(h2.SETTINGS_INITIAL_WINDOW_SIZE,
                                                                  self.client_initial_window)
                        if self.failed is not None:
                            self._inject(h2.frame(h2.SETTINGS, h2.ACK, 0))
                    if self.failed is None:
                        out.append(buf[at:end])
                elif ftype == h2.RST_STREAM:
                    ls = self._end_local(sid)
                    if ls is not None or sid in self.local_done:
                        if ls is not None and ls.task is not None:
                            ls.task.cancel()
                        self._drop_reply(sid)  # the runtime never saw the stream: nothing goes on
                    elif self.failed is None:
                        self.open.pop(sid, None)
                        if self.tally is not None:
                            self.tally.ended(sid, "CANCELLED")  # by the client
                        out.append(buf[at:end])
                elif ftype == h2.PING and (self.failed is not None or not flags & h2.ACK):
                    # Answered here: the runtime would count the client's pings against calls it
                    # never saw (gRPC servers send GOAWAY "too_many_pings" for that).
                    if not flags & h2.ACK:
                        self._inject(h2.frame(h2.PING, h2.ACK, 0, bytes(buf[at + 9:end])))
                elif self.failed is None:
                    out.append(buf[at:end])  # PING, PRIORITY, GOAWAY, extensions
                consumed = end
            if len(buf) - consumed >= 9:
                length = int.from_bytes(buf[consumed:consumed + 3], "big")
                if length > self.max_frame:
                    raise _Calm(f"a frame of {length} bytes; at most {self.max_frame} were allowed")
        except (HPACKError, ValueError, _Calm) as err:
            log.warning("%s from client (%s); closing the connection",
                        "too much" if isinstance(err, _Calm) else "malformed HTTP/2", err)
            code = COMPRESSION_ERROR if isinstance(err, HPACKError) else \
                h2.ENHANCE_YOUR_CALM if isinstance(err, _Calm) else h2.PROTOCOL_ERROR
            self._cut_off(code, str(err))
            return
        del buf[:consumed]
        if out and self.backend is not None and self.backend.transport is not None:
            self.backend.transport.write(b"".join(out))
        self._drain()

    def _cut_off(self, code: int, why: str) -> None:
        """End the connection with a GOAWAY saying why, whatever the runtime has sent so far."""
        self._drain()
        # The client must see a SETTINGS frame first; if the runtime's has not come yet, ours.
        preface = b"" if self.back_ready else h2.frame(h2.SETTINGS, 0, 0)
        self.transport.write(preface + h2.goaway(self.last_stream, code, why.encode()[:200]))
        self.transport.close()
        self.cin, self.hdr_buf = bytearray(), bytearray()

    def _client_window_update(self, sid: int, inc: int, raw: bytes | bytearray, out: list[bytes]) -> None:
        if sid == 0:
            self.cwin += inc
            if self.debt:
                # Keep the runtime's idea of the window no larger than the real one.
                paid = min(self.debt, inc)
                self.debt -= paid
                inc -= paid
                if inc and self.failed is None:
                    out.append(h2.window_update(0, inc))
            elif self.failed is None:
                out.append(raw)
        elif sid in self.swin:
            self.swin[sid] += inc
        elif self.failed is None:
            out.append(raw)

    def _header_fragment(self, ftype: int, flags: int, sid: int, payload: bytes, out: list[bytes]) -> None:
        if ftype == h2.HEADERS:
            if self.hdr_stream:
                raise ValueError("HEADERS while another header block is open")
            self.hdr_stream, self.hdr_flags = sid, flags
            self.hdr_buf = bytearray(h2.unpad(flags, payload, priority=True))
        else:
            if sid != self.hdr_stream:
                raise ValueError("CONTINUATION without an open header block")
            if len(self.hdr_buf) + len(payload) > MAX_HEADER_BLOCK:
                raise _Calm(f"a header block over {MAX_HEADER_BLOCK} bytes")
            self.hdr_buf += payload
        if not flags & h2.END_HEADERS:
            return
        sid, end_stream = self.hdr_stream, bool(self.hdr_flags & h2.END_STREAM)
        self.hdr_stream = 0
        headers = self.decoder.decode(bytes(self.hdr_buf), raw=True)
        ls = self.local.get(sid)
        if ls is not None:  # client trailers on a call we answer
            if end_stream:
                self._local_end(sid, ls)
            return
        if sid in self.local_done:
            return
        if sid <= self.last_stream:  # client trailers on a pass-through call
            out.append(h2.header_frames(sid, h2.encode_headers(headers), end_stream))
            return
        self.last_stream = sid
        path = next((v for k, v in headers if k == b":path"), b"").decode("latin-1")
        if self.refuse_after is not None and sid > self.refuse_after:
            self._inject(h2.rst_stream(sid, h2.REFUSED_STREAM))
            self._done(sid)  # its DATA, if the client sends any before it sees the reset, stays here
            return
        if self.failed is not None or self.server.local_route(path):
            ls = self.local[sid] = _Local(path, headers)
            self.swin[sid] = self.client_initial_window
            if len(self.local) > MAX_LOCAL_STREAMS:
                self._end_local(sid)
                self.swin.pop(sid, None)
                self._inject(h2.rst_stream(sid, h2.REFUSED_STREAM))
                return
            if not self._hold(ls, STREAM_COST + len(self.hdr_buf)):
                self._refuse(sid, ls, "too many requests held at once; try again")
                return
            if end_stream:
                self._local_end(sid, ls)
            return
        self.open[sid] = False
        if self.tally is not None:
            self.tally.started(sid, path)
        out.append(h2.header_frames(sid, h2.encode_headers(headers), end_stream))

    # -- calls answered here ---------------------------------------------------------------
    def _end_local(self, sid: int) -> _Local | None:
        ls = self.local.pop(sid, None)
        if ls is not None:
            self._done(sid)
            if ls.task is None:  # never started: nothing will give its bytes back
                self._unhold(ls)
        return ls

    def _done(self, sid: int) -> None:
        """A stream the runtime never saw has ended: late frames for it stay here."""
        self.local_done[sid] = None
        if len(self.local_done) > 1024:
            del self.local_done[next(iter(self.local_done))]

    def _drop_reply(self, sid: int) -> None:
        """The client reset a stream we answer: what is still queued for it is never sent."""
        self.swin.pop(sid, None)
        left = self.queued.pop(sid, 0)
        if left:
            self._charge(-left)
        if any(abs(s) == sid for _, _, s in self.out):
            kept = [f for f in self.out if abs(f[2]) != sid]
            self.out.clear()
            self.out.extend(kept)
        self.parked[:] = [f for f in self.parked if abs(f[2]) != sid]

    def _refuse(self, sid: int, ls: _Local, why: str) -> None:
        """Answer a call whose request we will not hold, and ask the client to stop sending it."""
        self._end_local(sid)
        ls.body = bytearray()
        self._answer(sid, Outcome(grpc.StatusCode.RESOURCE_EXHAUSTED, f"cri-resmgr: {why}"))
        self._inject(h2.rst_stream(sid, h2.NO_ERROR))
        self._drain()

    def _local_data(self, sid: int, flags: int, payload: bytes, flow: int) -> None:
        if flow:  # consumed here: give the client its window back
            credit = h2.window_update(0, flow)
            if sid in self.local and not flags & h2.END_STREAM:
                credit += h2.window_update(sid, flow)
            self._inject(credit)
        ls = self.local.get(sid)
        if ls is None:
            return
        data = h2.unpad(flags, payload)
        if len(ls.body) + len(data) > MAX_REQUEST + 5:
            self._refuse(sid, ls, f"request larger than {MAX_REQUEST} bytes")
            return
        if not self._hold(ls, len(data)):
            self._refuse(sid, ls, "too many request bytes held at once; try again")
            return
        ls.body += data
        if flags & h2.END_STREAM:
            self._local_end(sid, ls)

    def _local_end(self, sid: int, ls: _Local) -> None:
        if ls.task is None:
            ls.task = asyncio.ensure_future(self._run_local(sid, ls))

    async def _run_local(self, sid: int, ls: _Local) -> None:
        try:
            outcome = await self._outcome(ls)
        finally:
            self._unhold(ls)
        if self.closed or self._end_local(sid) is None:
            return  # the client went away or cancelled the call
        self._answer(sid, outcome)
        if self.failed is not None:
            self.goaway()  # new calls should come on a new connection, which tries the runtime again

    async def _outcome(self, ls: _Local) -> Outcome:
        body, ls.body = ls.body, bytearray()
        if self.failed is not None:  # answered once the whole request is in, like a server would
            return Outcome(grpc.StatusCode.UNAVAILABLE, self.failed)
        if len(body) < 5 or int.from_bytes(body[1:5], "big") != len(body) - 5:
            return Outcome(grpc.StatusCode.INTERNAL, "malformed gRPC request framing")
        if body[0] != 0:
            return Outcome(grpc.StatusCode.UNIMPLEMENTED, "compressed requests are not supported")
        timeout = next((h2.grpc_timeout(v) for k, v in ls.headers if k == b"grpc-timeout"), None)
        metadata = h2.headers_to_metadata(ls.headers, _GRPC_OWN)
        request = bytes(memoryview(body)[5:])
        body.clear()  # one copy of a big request at a time
        return await self.server.dispatcher.call(ls.path, request, metadata or None, timeout)

    def _answer(self, sid: int, outcome: Outcome) -> None:
        initial = _REPLY_HEADERS + h2.metadata_to_headers(outcome.initial)
        # grpc-message always, empty when there is none, as gRPC's Go server writes it.
        trailer = [(b"grpc-status", str(outcome.code.value[0]).encode()),
                   (b"grpc-message", h2.percent_encode(outcome.details))]
        trailer += h2.metadata_to_headers(outcome.trailing)
        if outcome.code != grpc.StatusCode.OK or outcome.reply is None:
            self._inject(h2.header_frames(sid, h2.encode_headers(initial + trailer), True), 0, -sid)
        else:
            self._inject(h2.header_frames(sid, h2.encode_headers(initial), False))
            data = h2.grpc_message(outcome.reply)
            for i in range(0, len(data), h2.DEFAULT_MAX_FRAME):
                chunk = data[i:i + h2.DEFAULT_MAX_FRAME]
                self._inject(h2.frame(h2.DATA, 0, sid, chunk), len(chunk), sid)
            self._inject(h2.header_frames(sid, h2.encode_headers(trailer), True), 0, -sid)
        self._drain()

    # -- runtime side ----------------------------------------------------------------------
    def on_backend(self, data: bytes) -> None:
        if self.closed:
            return
        buf = self.bin
        buf += data
        start = consumed = 0  # start: first byte not yet written while writing straight through
        direct = not self.out and not self.parked
        queue = self.out
        for at, end, ftype, flags in h2.split_frames(buf, 0):
            consumed = end
            self.back_ready = True
            flow = 0
            if ftype == h2.DATA:
                flow = end - at - 9
                if flags & h2.END_STREAM:
                    sid = int.from_bytes(buf[at + 5:at + 9], "big") & 0x7FFFFFFF
                    self.open.pop(sid, None)
                    if self.tally is not None:
                        self.tally.ended(sid, "UNKNOWN")  # gRPC ends with trailers; this is no gRPC
            elif ftype == h2.HEADERS or ftype == h2.CONTINUATION:
                self.back_hdr_open = not flags & h2.END_HEADERS
                if self.tally is not None:
                    self.tally.header_frame(ftype, flags, int.from_bytes(buf[at + 5:at + 9], "big") & 0x7FFFFFFF,
                                            bytes(buf[at + 9:end]))
                if ftype == h2.HEADERS:
                    sid = int.from_bytes(buf[at + 5:at + 9], "big") & 0x7FFFFFFF
                    if flags & h2.END_STREAM:
                        self.open.pop(sid, None)
                    elif sid in self.open:
                        self.open[sid] = True
            elif ftype == h2.RST_STREAM:
                sid = int.from_bytes(buf[at + 5:at + 9], "big") & 0x7FFFFFFF
                self.open.pop(sid, None)
                if self.tally is not None:
                    self.tally.ended(sid, "CANCELLED")
            elif ftype == h2.SETTINGS and not flags & h2.ACK:
                settings = h2.parse_settings(bytes(buf[at + 9:end]))
                size = settings.get(h2.SETTINGS_HEADER_TABLE_SIZE)
                if size is not None:
                    self.decoder.max_allowed_table_size = max(size, self.decoder.max_allowed_table_size)
                self.max_frame = max(settings.get(h2.SETTINGS_MAX_FRAME_SIZE, self.max_frame), self.max_frame)
            elif ftype == h2.GOAWAY:
                # Not forwarded: its last-stream-id knows nothing of the calls answered here.
                if direct and at > start:
                    self.transport.write(bytes(buf[start:at]))
                direct = False
                self._backend_goaway(int.from_bytes(buf[at + 9:at + 13], "big") & 0x7FFFFFFF)
                continue
            if direct and flow <= self.cwin:
                self.cwin -= flow
            else:
                if direct:  # from here on, order must go through the queue
                    if at > start:
                        self.transport.write(bytes(buf[start:at]))
                    direct = False
                queue.append((bytes(buf[at:end]), flow, 0))
            if not self.back_hdr_open and self.parked:
                # The runtime's header block just ended: our held frames go right after it.
                if direct:
                    self.transport.write(bytes(buf[start:end]))
                    direct = False
                queue.extend(self.parked)
                self.parked.clear()
        if direct and consumed > start:
            self.transport.write(bytes(buf[start:consumed]))
        del buf[:consumed]
        if not direct:
            self._drain()

    def _backend_goaway(self, last: int) -> None:
        """The runtime takes no calls above `last`: refuse those (safe to retry), stop new ones."""
        for sid in [sid for sid in self.open if sid > last]:
            del self.open[sid]
            self._inject(h2.rst_stream(sid, h2.REFUSED_STREAM))
        self.goaway()

    def backend_lost(self) -> None:
        """The runtime connection is gone: end its calls as UNAVAILABLE, finish ours, then close."""
        if self.closed or self.transport is None:
            return
        if self.back_hdr_open:  # cut inside a header block: nothing sound can follow
            self._drain()
            self.transport.close()
            return
        self.goaway()
        for sid, headers_sent in self.open.items():
            fields = [] if headers_sent else list(_REPLY_HEADERS)
            fields += [(b"grpc-status", str(grpc.StatusCode.UNAVAILABLE.value[0]).encode()),
                       (b"grpc-message", h2.percent_encode(
                           f"runtime socket {self.server.runtime_socket}: connection lost"))]
            self._inject(h2.header_frames(sid, h2.encode_headers(fields), True))
        self.open.clear()
        self._drain()
        asyncio.ensure_future(self._close_when_idle())

    async def _close_when_idle(self) -> None:
        while self.local and not self.closed:
            await asyncio.sleep(0.01)
        self.close()

    # -- writing to the client ---------------------------------------------------------------
    def _inject(self, data: bytes, flow: int = 0, sid: int = 0) -> None:
        """Queue a frame of our own; never before the runtime's SETTINGS or inside its header block."""
        if flow and sid > 0:  # reply bytes count against the budgets until written
            self.queued[sid] = self.queued.get(sid, 0) + flow
            self._charge(flow)
        (self.parked if self.back_hdr_open or not self.back_ready else self.out).append((data, flow, sid))

    def _drain(self) -> None:
        if self.closed or self.transport is None:
            return
        q = self.out
        chunks = []
        while q:
            data, flow, sid = q[0]
            if flow:
                if flow > self.cwin:
                    break
                if sid > 0:
                    window = self.swin.get(sid, 0)
                    if flow > window:
                        break
                    self.swin[sid] = window - flow
                    self.debt += flow
                    self._charge(-flow)
                    left = self.queued[sid] - flow
                    if left:
                        self.queued[sid] = left
                    else:
                        del self.queued[sid]
                self.cwin -= flow
            elif sid < 0:
                self.swin.pop(-sid, None)
            chunks.append(data)
            q.popleft()
        if chunks:
            self.transport.write(b"".join(chunks))
            if self.transport.get_write_buffer_size() > MAX_UNREAD:
                log.warning("client leaves more than %d bytes unread; closing the connection", MAX_UNREAD)
                self.transport.abort()

    # -- shutdown --------------------------------------------------------------------------
    def goaway(self) -> None:
        """No new calls on this connection; calls already started may finish."""
        if self.refuse_after is None:
            self.refuse_after = self.last_stream
            self._inject(h2.goaway(self.last_stream))
            self._drain()

    def busy(self) -> bool:
        return bool(self.open or self.local)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self._drain()
            self.transport.close()
