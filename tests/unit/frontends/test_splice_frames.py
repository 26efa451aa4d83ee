"""The splice front end frame by frame: a client and a runtime made of fake transports."""

from __future__ import annotations

import asyncio

import grpc
import hpack
import pytest

from resmgr.frontends.relay import frames as h2
from resmgr.frontends.relay.dispatch import Outcome
from resmgr.frontends.relay.local import REPLY_HEADERS
from resmgr.frontends.relay.splice import SpliceServer, _Backend, _Conn

VERSION = b"/runtime.v1.RuntimeService/Version"
CREATE = b"/runtime.v1.RuntimeService/CreateContainer"


class Transport:
    def __init__(self) -> None:
        self.buf = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.buf += data

    def close(self) -> None:
        self.closed = True

    abort = close

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def frames(self, preface: bool = False) -> list[tuple[int, int, int, bytes]]:
        """(type, flags, stream, payload) of everything written since the last call."""
        pos = len(h2.PREFACE) if preface and self.buf.startswith(h2.PREFACE) else 0
        out = [(t, f, int.from_bytes(self.buf[a + 5:a + 9], "big") & 0x7FFFFFFF, bytes(self.buf[a + 9:e]))
               for a, e, t, f in h2.split_frames(self.buf, pos)]
        self.buf.clear()
        return out


class Dispatcher:
    """Answers CreateContainer here: the reply echoes the request, with a trailer."""

    def __init__(self, outcome: Outcome | None = None) -> None:
        self.calls: list[tuple[str, bytes]] = []
        self.outcome = outcome

    def wants(self, path: str) -> bool:
        return path == CREATE.decode()

    async def call(self, path, request, metadata, timeout) -> Outcome:
        self.calls.append((path, request))
        return self.outcome or Outcome(grpc.StatusCode.OK, reply=b"re:" + request, trailing=(("x-trail", "t"),))


class Pair:
    def __init__(self, dispatcher: Dispatcher | None = None) -> None:
        self.dispatcher = dispatcher or Dispatcher()
        self.conn = _Conn(SpliceServer(self.dispatcher, "/nonexistent.sock"))
        self.client = self.conn.transport = Transport()
        self.conn.server.conns.add(self.conn)
        backend = _Backend(self.conn)
        backend.connection_made(Transport())
        self.conn.backend = backend
        self.runtime: Transport = backend.transport  # type: ignore[assignment]
        self.encoder = hpack.Encoder()  # the client's, with its dynamic table
        self.conn.on_backend(h2.frame(h2.SETTINGS, 0, 0))  # the runtime's SETTINGS come first
        self.send(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0))
        assert [f[0] for f in self.client.frames()] == [h2.SETTINGS]
        assert [f[0] for f in self.runtime.frames(preface=True)] == [h2.SETTINGS]

    def send(self, data: bytes) -> None:
        self.conn.data_received(data)

    def block(self, path: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> bytes:
        return self.encoder.encode([(b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
                                    (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
                                    *(extra or [])])

    def call(self, sid: int, path: bytes, body: bytes = b"", end: bool = True) -> None:
        self.send(h2.frame(h2.HEADERS, h2.END_HEADERS, sid, self.block(path)))
        if end:
            self.send(h2.frame(h2.DATA, h2.END_STREAM, sid, h2.grpc_message(body)))


def _decoded(payload: bytes) -> dict[bytes, bytes]:
    """A header block decoded by a decoder that never saw another block."""
    return dict(hpack.Decoder().decode(payload, raw=True))


def test_pass_through_header_blocks_need_no_dynamic_table():
    p = Pair()
    for sid in (1, 3):  # the second block refers to the client's dynamic table
        p.call(sid, VERSION, b"v1")
    frames = p.runtime.frames()
    blocks = [f for f in frames if f[0] == h2.HEADERS]
    assert [b[2] for b in blocks] == [1, 3]
    assert all(_decoded(b[3])[b":path"] == VERSION for b in blocks)
    assert [f[3] for f in frames if f[0] == h2.DATA] == [h2.grpc_message(b"v1")] * 2  # bytes untouched


def test_a_table_size_update_from_the_client_is_followed():
    p = Pair()
    p.call(1, VERSION)
    p.encoder.header_table_size = 0  # the next block starts with a table size update
    p.call(3, VERSION)
    p.encoder.header_table_size = 4096
    p.call(5, VERSION)
    paths = [_decoded(f[3])[b":path"] for f in p.runtime.frames() if f[0] == h2.HEADERS]
    assert paths == [VERSION] * 3


def test_continuation_frames_make_one_header_block():
    p = Pair()
    block = p.block(VERSION, [(b"x-long", b"v" * 300)])
    p.send(h2.frame(h2.HEADERS, 0, 1, block[:10]) + h2.frame(h2.CONTINUATION, 0, 1, block[10:40])
           + h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, block[40:]))
    [headers] = [f for f in p.runtime.frames() if f[0] == h2.HEADERS]
    assert headers[1] & h2.END_HEADERS and _decoded(headers[3])[b"x-long"] == b"v" * 300


def test_a_continuation_of_no_open_block_is_a_protocol_error():
    p = Pair()
    p.send(h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, p.block(VERSION)))
    [goaway] = [f for f in p.client.frames() if f[0] == h2.GOAWAY]
    assert int.from_bytes(goaway[3][4:8], "big") == h2.PROTOCOL_ERROR and p.client.closed


def test_padding_is_removed_from_headers_and_left_on_passed_data():
    p = Pair()
    block = p.block(VERSION)
    p.send(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.PADDED, 1, bytes([4]) + block + b"\0" * 4))
    data = bytes([3]) + h2.grpc_message(b"x") + b"\0" * 3
    p.send(h2.frame(h2.DATA, h2.END_STREAM | h2.PADDED, 1, data))
    frames = p.runtime.frames()
    assert _decoded(frames[0][3])[b":path"] == VERSION and not frames[0][1] & h2.PADDED
    assert frames[1] == (h2.DATA, h2.END_STREAM | h2.PADDED, 1, data)


async def test_a_call_answered_here_gets_reply_and_trailers_and_never_reaches_the_runtime():
    p = Pair()
    p.call(1, CREATE, b"req")
    await asyncio.sleep(0.01)
    assert p.dispatcher.calls == [(CREATE.decode(), b"req")]
    assert p.runtime.frames() == []  # the request's window is given back to the client here
    frames = p.client.frames()
    kinds = [(f[0], f[2]) for f in frames if f[0] != h2.WINDOW_UPDATE]
    assert kinds == [(h2.HEADERS, 1), (h2.DATA, 1), (h2.HEADERS, 1)]
    reply = [f for f in frames if f[0] == h2.HEADERS]
    decoder = hpack.Decoder()  # the relay's own blocks must not touch the client's table either
    assert dict(decoder.decode(reply[0][3], raw=True))[b":status"] == b"200"
    assert [f[3] for f in frames if f[0] == h2.DATA] == [h2.grpc_message(b"re:req")]
    trailers = dict(decoder.decode(reply[1][3], raw=True))
    assert trailers[b"grpc-status"] == b"0" and trailers[b"x-trail"] == b"t" and reply[1][1] & h2.END_STREAM


async def test_a_failed_call_answered_here_is_trailers_only():
    p = Pair(Dispatcher(Outcome(grpc.StatusCode.RESOURCE_EXHAUSTED, "no room: 2 CPUs")))
    p.call(1, CREATE, b"req")
    await asyncio.sleep(0.01)
    [only] = [f for f in p.client.frames() if f[0] == h2.HEADERS]
    fields = _decoded(only[3])
    assert only[1] & h2.END_STREAM and fields[b"grpc-status"] == b"8"
    assert fields[b"grpc-message"] == b"no room: 2 CPUs"


async def test_reply_bytes_are_debt_the_runtime_never_hears_of():
    p = Pair()
    p.call(1, CREATE, b"x" * 100)
    await asyncio.sleep(0.01)
    sent = sum(len(f[3]) for f in p.client.frames() if f[0] == h2.DATA)
    p.runtime.frames()
    # The client returns the window of our reply plus 10 bytes of the runtime's: only those 10 go on.
    p.send(h2.window_update(0, sent + 10))
    assert p.runtime.frames() == [(h2.WINDOW_UPDATE, 0, 0, (10).to_bytes(4, "big"))]


async def test_rst_stream_from_the_client_cancels_a_call_answered_here():
    p = Pair()
    p.call(1, CREATE, end=False)
    p.send(h2.rst_stream(1, h2.CANCEL))
    p.send(h2.frame(h2.DATA, h2.END_STREAM, 1, h2.grpc_message(b"late")))
    await asyncio.sleep(0.01)
    assert p.dispatcher.calls == []
    # The runtime never saw stream 1: neither the reset nor the late DATA reach it (on an idle
    # stream either is a connection error there); the client gets the late bytes' window back.
    assert p.runtime.frames() == []
    assert (h2.WINDOW_UPDATE, 0, 0, (len(h2.grpc_message(b"late"))).to_bytes(4, "big")) in p.client.frames()


async def test_rst_stream_after_a_reply_was_queued_drops_it_and_later_calls_still_flow():
    p = Pair()
    p.send(h2.frame(h2.SETTINGS, 0, 0, (4).to_bytes(2, "big") + (0).to_bytes(4, "big")))  # stream window 0
    p.runtime.frames()
    p.call(1, CREATE, b"req")
    await asyncio.sleep(0.01)
    assert [f[0] for f in p.client.frames()] == [h2.WINDOW_UPDATE, h2.HEADERS]  # the DATA waits for window
    p.send(h2.rst_stream(1, h2.CANCEL))
    assert p.runtime.frames() == [] and p.conn.held == 0
    p.call(3, VERSION)
    p.conn.on_backend(h2.frame(h2.HEADERS, h2.END_HEADERS, 3, hpack.Encoder().encode([(b":status", b"200")])))
    assert [(f[0], f[2]) for f in p.client.frames()] == [(h2.HEADERS, 3)]  # not stuck behind stream 1


def test_rst_stream_passes_both_ways_on_a_passed_call():
    p = Pair()
    p.call(1, VERSION, end=False)
    p.conn.on_backend(h2.rst_stream(1, h2.CANCEL))
    assert (h2.RST_STREAM, 0, 1, h2.CANCEL.to_bytes(4, "big")) in p.client.frames()
    p.call(3, VERSION, end=False)
    p.send(h2.rst_stream(3, h2.CANCEL))
    assert (h2.RST_STREAM, 0, 3, h2.CANCEL.to_bytes(4, "big")) in p.runtime.frames()


def test_goaway_from_the_runtime_refuses_what_it_will_not_serve_and_is_not_passed_on():
    p = Pair()
    p.call(1, VERSION, end=False)
    p.call(3, VERSION, end=False)
    p.conn.on_backend(h2.goaway(1))
    frames = p.client.frames()
    assert (h2.RST_STREAM, 0, 3, h2.REFUSED_STREAM.to_bytes(4, "big")) in frames
    [goaway] = [f for f in frames if f[0] == h2.GOAWAY]
    assert int.from_bytes(goaway[3][:4], "big") == 3  # ours: the last stream the client opened
    p.call(5, VERSION)  # opened after our GOAWAY: refused here, never sent on
    assert (h2.RST_STREAM, 0, 5, h2.REFUSED_STREAM.to_bytes(4, "big")) in p.client.frames()
    assert not [f for f in p.runtime.frames() if f[2] == 5]


def test_goaway_from_the_client_is_passed_on():
    p = Pair()
    p.send(h2.goaway(0))
    assert [f[0] for f in p.runtime.frames()] == [h2.GOAWAY]


def test_pings_from_the_client_are_answered_here():
    p = Pair()
    p.send(h2.frame(h2.PING, 0, 0, b"12345678"))
    assert p.client.frames() == [(h2.PING, h2.ACK, 0, b"12345678")]
    assert p.runtime.frames() == []


@pytest.mark.parametrize("garbage, code", [
    (h2.frame(h2.HEADERS, h2.END_HEADERS, 1, b"\xff\xff\xff\xff\xff"), 0x9),  # HPACK that does not decode
    (h2.frame(h2.DATA, 0, 1, b"x" * 10)[:3].replace(b"\x00\x00\x0a", b"\xff\xff\xff") + b"\0" * 20, 0xB),
])
def test_a_client_sending_garbage_is_cut_off_with_a_reason(garbage, code):
    p = Pair()
    p.send(garbage)
    [goaway] = [f for f in p.client.frames() if f[0] == h2.GOAWAY]
    assert int.from_bytes(goaway[3][4:8], "big") == code and p.client.closed


def test_a_client_without_the_preface_is_closed():
    conn = _Conn(SpliceServer(Dispatcher(), "/nonexistent.sock"))
    conn.transport = client = Transport()
    backend = _Backend(conn)
    backend.connection_made(Transport())
    conn.backend = backend
    conn.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert client.closed and backend.transport.buf == b""


class SlowDispatcher(Dispatcher):
    """Answers CreateContainer once released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def call(self, path, request, metadata, timeout) -> Outcome:
        await self.release.wait()
        return await super().call(path, request, metadata, timeout)


async def test_stopping_waits_for_calls_in_flight_and_no_longer():
    p = Pair(SlowDispatcher())
    p.call(1, CREATE, b"req")
    p.call(3, VERSION)  # passed through, answered by the runtime below
    stopping = asyncio.create_task(p.conn.server.stop(grace=30))
    await asyncio.sleep(0)
    assert not stopping.done()
    p.dispatcher.release.set()
    await asyncio.sleep(0.01)
    assert not stopping.done()  # the runtime has not answered stream 3
    done = hpack.Encoder().encode([(b"grpc-status", b"0")])
    p.conn.on_backend(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 3, done))
    await asyncio.wait_for(stopping, 5)  # woken by the end of the last call, not by the grace
    assert (h2.GOAWAY, 0) in [(f[0], f[2]) for f in p.client.frames()] and p.client.closed


async def test_a_lost_runtime_connection_closes_once_calls_answered_here_end():
    p = Pair(SlowDispatcher())
    p.call(1, CREATE, b"req")
    await asyncio.sleep(0)
    p.conn.backend_lost()
    await asyncio.sleep(0.01)
    assert not p.client.closed  # its call answered here still runs
    p.dispatcher.release.set()
    await asyncio.wait_for(p.conn.closing, 5)
    assert p.client.closed and (h2.HEADERS, 1) in [(f[0], f[2]) for f in p.client.frames()]


class ClosedUvTransport(Transport):
    """uvloop's transport once closed: a write raises (asyncio's only logs)."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = True

    def write(self, data: bytes) -> None:
        raise RuntimeError("unable to perform operation on <UnixTransport closed=True>; the handler is closed")


async def test_what_the_client_sends_after_the_runtime_connection_closed_goes_nowhere():
    # A containerd restart: kubelet went on sending on its connection, the relay wrote that to the
    # closed runtime connection, and uvloop's error ended kubelet's connection, calls answered
    # here included ("Fatal error on transport").
    p = Pair(SlowDispatcher())
    p.call(1, CREATE, b"req")
    await asyncio.sleep(0)
    p.conn.backend.transport = ClosedUvTransport()  # closed; its connection_lost is yet to come
    p.call(3, VERSION, b"v")  # passed on: goes nowhere
    p.send(h2.frame(h2.WINDOW_UPDATE, 0, 0, (1 << 16).to_bytes(4, "big")))
    p.conn.backend_lost()
    assert not p.client.closed  # the call answered here still runs
    p.dispatcher.release.set()
    await asyncio.wait_for(p.conn.closing, 5)
    assert p.client.closed and (h2.HEADERS, 1) in [(f[0], f[2]) for f in p.client.frames()]


def test_what_the_runtime_sends_once_the_client_connection_closed_goes_nowhere():
    p = Pair()
    p.call(1, VERSION, b"v")
    p.conn.transport = p.conn.writer.transport = ClosedUvTransport()  # its connection_lost is yet to come
    reply = h2.header_frames(1, h2.encode_headers(list(REPLY_HEADERS)), False)
    p.conn.on_backend(reply + h2.frame(h2.DATA, 0, 1, h2.grpc_message(b"x")))
    p.conn.writer.drain()


def test_the_header_encoder_keeps_only_short_fields_and_a_bounded_number():
    big = h2.encode_headers([(b"x-big", b"v" * 100_000)])
    assert big.endswith(b"v" * 100_000)
    assert not any(len(v) > 1000 for _, v in h2._FIELDS)
    for i in range(10_000):
        h2.encode_headers([(b"x-n", str(i).encode())])
    assert len(h2._FIELDS) <= h2._FIELDS_KEPT
    assert h2.encode_headers([(b"a", b"b")]) == b"\x00\x01a\x01b"
