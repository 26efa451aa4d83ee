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

The connection (here) parses both directions; writing to the client within its windows
is writer.py, calls answered here are local.py.

Why not grpc.aio on both sides: on 2-core VMs grpc.aio spends about 1 ms of CPU per
relayed call in thread hand-offs; splicing frames in one event loop costs about 0.1 ms.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
import hpack
from hpack.exceptions import HPACKError

from resmgr import metrics
from resmgr.frontends.relay import frames as h2
from resmgr.frontends.relay.dispatch import Dispatcher
from resmgr.frontends.relay.local import REPLY_HEADERS, LocalCalls
from resmgr.frontends.relay.methods import is_image_method
from resmgr.frontends.relay.passmetrics import PassMetrics
from resmgr.frontends.relay.writer import Budget, ClientWriter

log = logging.getLogger("cri-resmgr.relay")

MAX_HEADER_BLOCK = 1 << 20  # bytes of one header block, compressed or decoded
HELD_PER_CONNECTION = 64 << 20  # request and reply bytes held for calls answered here
HELD_IN_ALL = 128 << 20
COMPRESSION_ERROR = 0x9


class SpliceServer:
    def __init__(self, dispatcher: Dispatcher, runtime_socket: str, image_socket: str = "") -> None:
        self.dispatcher = dispatcher
        self.runtime_socket = runtime_socket
        # Two backends cannot share one client connection's HPACK context; image calls to a
        # separate image socket are therefore answered here, through the Dispatcher.
        self.split_images = bool(image_socket) and image_socket != runtime_socket
        self.conns: set[_Conn] = set()
        self.budget = Budget(limit=HELD_IN_ALL)  # bytes held for calls answered here, all connections
        self._routes: dict[str, bool] = {}
        self._server: asyncio.AbstractServer | None = None

    def local_route(self, path: str) -> bool:
        local = self._routes.get(path)
        if local is None:
            local = self._routes[path] = self.dispatcher.wants(path) or (
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
        waits = [asyncio.create_task(c.until(lambda c=c: c.closed or not c.busy())) for c in self.conns]
        if waits:
            await asyncio.wait(waits, timeout=grace)
            for w in waits:
                w.cancel()
        for conn in list(self.conns):
            conn.close()


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
        self.backend: _Backend | None = None
        self.failed: str | None = None  # runtime unreachable: answer every call here
        self.closed = False
        self.budget = Budget(server.budget, HELD_PER_CONNECTION)
        self.writer = ClientWriter(self.budget)
        self.local = LocalCalls(server.dispatcher, self.writer, self.budget, lambda: self.failed, self.goaway,
                                self._calls_ended)
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
        self.open: dict[int, bool] = {}  # pass-through calls in flight -> runtime sent headers
        self.client_initial_window = h2.DEFAULT_WINDOW
        self.max_frame = h2.DEFAULT_MAX_FRAME  # what the runtime accepts, so the client may send
        # runtime -> client
        self.bin = bytearray()
        self.passmetrics = PassMetrics() if metrics.enabled else None
        self.connecting: asyncio.Task[None] | None = None
        self.closing: asyncio.Task[None] | None = None
        self.waiter: asyncio.Event | None = None  # set when calls may have ended (see until())

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.writer.transport

    @transport.setter
    def transport(self, transport: asyncio.Transport | None) -> None:
        self.writer.transport = transport

    @property
    def held(self) -> int:
        """Bytes held for calls answered here."""
        return self.budget.held

    # -- client side ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.conns.add(self)
        self.connecting = asyncio.ensure_future(self._connect())

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
            self.writer.back_ready = True
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
        self.local.close()
        self.writer.close()
        # Nothing of this connection's may outlive it, even if a reference cycle keeps it a while.
        self.cin, self.bin, self.hdr_buf = bytearray(), bytearray(), bytearray()
        if self.backend is not None and self.backend.transport is not None:
            self.backend.transport.close()
        self._calls_ended()

    # The client does not read: stop reading from the runtime until it does.
    def pause_writing(self) -> None:
        if self.backend is not None:
            _reading(self.backend.transport, False)

    def resume_writing(self) -> None:
        if self.backend is not None:
            _reading(self.backend.transport, True)

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
        local, w = self.local, self.writer
        try:
            for at, end, ftype, flags in h2.split_frames(buf, pos):
                length = end - at - 9
                sid = int.from_bytes(buf[at + 5:at + 9], "big") & 0x7FFFFFFF
                if sid in local.done and ftype != h2.HEADERS and ftype != h2.CONTINUATION \
                        and sid not in w.swin:  # a reply still being sent needs its window updates
                    if ftype == h2.DATA and length:
                        w.inject(h2.window_update(0, length))  # still counts on the connection
                elif ftype == h2.DATA:
                    if sid in local.calls or self.failed is not None:
                        local.data(sid, flags, bytes(buf[at + 9:end]), length)
                    else:
                        out.append(buf[at:end])
                elif ftype == h2.HEADERS or ftype == h2.CONTINUATION:
                    self._header_fragment(ftype, flags, sid, bytes(buf[at + 9:end]), out)
                elif ftype == h2.WINDOW_UPDATE:
                    w.window_update(sid, int.from_bytes(buf[at + 9:at + 13], "big") & 0x7FFFFFFF, buf[at:end],
                                    out if self.failed is None else None)
                elif ftype == h2.SETTINGS:
                    if not flags & h2.ACK:
                        settings = h2.parse_settings(bytes(buf[at + 9:end]))
                        self.client_initial_window = settings.get(h2.SETTINGS_INITIAL_WINDOW_SIZE,
                                                                  self.client_initial_window)
                        if self.failed is not None:
                            w.inject(h2.frame(h2.SETTINGS, h2.ACK, 0))
                    if self.failed is None:
                        out.append(buf[at:end])
                elif ftype == h2.RST_STREAM:
                    if local.reset(sid):
                        pass  # the runtime never saw the stream: nothing goes on
                    elif self.failed is None:
                        self.open.pop(sid, None)
                        if self.passmetrics is not None:
                            self.passmetrics.ended(sid, "CANCELLED")  # by the client
                        out.append(buf[at:end])
                elif ftype == h2.PING and (self.failed is not None or not flags & h2.ACK):
                    # Answered here: the runtime would count the client's pings against calls it
                    # never saw (gRPC servers send GOAWAY "too_many_pings" for that).
                    if not flags & h2.ACK:
                        w.inject(h2.frame(h2.PING, h2.ACK, 0, bytes(buf[at + 9:end])))
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
        back = self.backend.transport if self.backend is not None else None
        # Closed, its connection_lost yet to come (the runtime went): uvloop raises on a write.
        if out and back is not None and not back.is_closing():
            back.write(b"".join(out))
        w.drain()
        if self.waiter is not None:
            self._calls_ended()

    def _cut_off(self, code: int, why: str) -> None:
        """End the connection with a GOAWAY saying why, whatever the runtime has sent so far."""
        self.writer.drain()
        # The client must see a SETTINGS frame first; if the runtime's has not come yet, ours.
        preface = b"" if self.writer.back_ready else h2.frame(h2.SETTINGS, 0, 0)
        self.transport.write(preface + h2.goaway(self.last_stream, code, why.encode()[:200]))
        self.transport.close()
        self.cin, self.hdr_buf = bytearray(), bytearray()

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
        local = self.local
        call = local.calls.get(sid)
        if call is not None:  # client trailers on a call we answer
            if end_stream:
                local.complete(call)
            return
        if sid in local.done:
            return
        if sid <= self.last_stream:  # client trailers on a pass-through call
            out.append(h2.header_frames(sid, h2.encode_headers(headers), end_stream))
            return
        self.last_stream = sid
        path = next((v for k, v in headers if k == b":path"), b"").decode("latin-1")
        if self.refuse_after is not None and sid > self.refuse_after:
            self.writer.inject(h2.rst_stream(sid, h2.REFUSED_STREAM))
            local.remember(sid)  # its DATA, if the client sends any before it sees the reset, stays here
            return
        if self.failed is not None or self.server.local_route(path):
            local.begin(sid, path, headers, end_stream, len(self.hdr_buf), self.client_initial_window)
            return
        self.open[sid] = False
        if self.passmetrics is not None:
            self.passmetrics.started(sid, path)
        out.append(h2.header_frames(sid, h2.encode_headers(headers), end_stream))

    # -- runtime side ----------------------------------------------------------------------
    def on_backend(self, data: bytes) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            return  # the client's connection is going: nothing more reaches it
        buf = self.bin
        buf += data
        w = self.writer
        transport = w.transport
        start = consumed = 0  # start: first byte not yet written while writing straight through
        direct = not w.out and not w.parked
        queue = w.out
        for at, end, ftype, flags in h2.split_frames(buf, 0):
            consumed = end
            w.back_ready = True
            flow = 0
            if ftype == h2.DATA:
                flow = end - at - 9
                if flags & h2.END_STREAM:
                    sid = int.from_bytes(buf[at + 5:at + 9], "big") & 0x7FFFFFFF
                    self.open.pop(sid, None)
                    if self.passmetrics is not None:
                        self.passmetrics.ended(sid, "UNKNOWN")  # gRPC ends with trailers; this is no gRPC
            elif ftype == h2.HEADERS or ftype == h2.CONTINUATION:
                w.back_hdr_open = not flags & h2.END_HEADERS
                if self.passmetrics is not None:
                    self.passmetrics.header_frame(ftype, flags, int.from_bytes(buf[at + 5:at + 9], "big") & 0x7FFFFFFF,
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
                if self.passmetrics is not None:
                    self.passmetrics.ended(sid, "CANCELLED")
            elif ftype == h2.SETTINGS and not flags & h2.ACK:
                settings = h2.parse_settings(bytes(buf[at + 9:end]))
                size = settings.get(h2.SETTINGS_HEADER_TABLE_SIZE)
                if size is not None:
                    self.decoder.max_allowed_table_size = max(size, self.decoder.max_allowed_table_size)
                self.max_frame = max(settings.get(h2.SETTINGS_MAX_FRAME_SIZE, self.max_frame), self.max_frame)
            elif ftype == h2.GOAWAY:
                # Not forwarded: its last-stream-id knows nothing of the calls answered here.
                if direct and at > start:
                    transport.write(bytes(buf[start:at]))
                direct = False
                self._backend_goaway(int.from_bytes(buf[at + 9:at + 13], "big") & 0x7FFFFFFF)
                continue
            if direct and flow <= w.cwin:
                w.cwin -= flow
            else:
                if direct:  # from here on, order must go through the queue
                    if at > start:
                        transport.write(bytes(buf[start:at]))
                    direct = False
                queue.append((bytes(buf[at:end]), flow, 0))
            if not w.back_hdr_open and w.parked:
                # The runtime's header block just ended: our held frames go right after it.
                if direct:
                    transport.write(bytes(buf[start:end]))
                    direct = False
                w.unpark()
        if direct and consumed > start:
            transport.write(bytes(buf[start:consumed]))
        del buf[:consumed]
        if not direct:
            w.drain()
        if self.waiter is not None:
            self._calls_ended()

    def _backend_goaway(self, last: int) -> None:
        """The runtime takes no calls above `last`: refuse those (safe to retry), stop new ones."""
        for sid in [sid for sid in self.open if sid > last]:
            del self.open[sid]
            self.writer.inject(h2.rst_stream(sid, h2.REFUSED_STREAM))
        self.goaway()

    def backend_lost(self) -> None:
        """The runtime connection is gone: end its calls as UNAVAILABLE, finish ours, then close."""
        if self.closed or self.transport is None:
            return
        if self.writer.back_hdr_open:  # cut inside a header block: nothing sound can follow
            self.writer.drain()
            self.transport.close()
            return
        self.goaway()
        for sid, headers_sent in self.open.items():
            fields = [] if headers_sent else list(REPLY_HEADERS)
            fields += [(b"grpc-status", str(grpc.StatusCode.UNAVAILABLE.value[0]).encode()),
                       (b"grpc-message", h2.percent_encode(
                           f"runtime socket {self.server.runtime_socket}: connection lost"))]
            self.writer.inject(h2.header_frames(sid, h2.encode_headers(fields), True))
        self.open.clear()
        self.writer.drain()
        self.closing = asyncio.ensure_future(self._close_when_idle())

    async def _close_when_idle(self) -> None:
        await self.until(lambda: self.closed or not self.local.calls)
        self.close()

    # -- shutdown --------------------------------------------------------------------------
    def goaway(self) -> None:
        """No new calls on this connection; calls already started may finish."""
        if self.refuse_after is None:
            self.refuse_after = self.last_stream
            self.writer.inject(h2.goaway(self.last_stream))
            self.writer.drain()

    def busy(self) -> bool:
        return bool(self.open or self.local.calls)

    async def until(self, done: Callable[[], bool]) -> None:
        """Wait until done() holds; it is checked again whenever calls may have ended."""
        while not done():
            if self.waiter is None:
                self.waiter = asyncio.Event()
            await self.waiter.wait()

    def _calls_ended(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter.set()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.writer.drain()
            self.transport.close()
