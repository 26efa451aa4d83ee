"""ttrpc over NRI's connection multiplexer, on asyncio.

One unix stream socket (the trunk) carries logical connections. A trunk frame is
ConnID (uint32 BE) + payload length (uint32 BE) + payload; each ConnID is a byte
stream of its own, so a ttrpc message may span frames and a frame may hold several
messages. On ConnID 1 the plugin is the ttrpc server, on ConnID 2 the client.

A ttrpc message is length (uint32 BE), stream ID (uint32 BE), type (uint8: 1 request,
2 response, 3 data), flags (uint8), then at most 4 MiB of data: a ttrpc.Request or
ttrpc.Response. Only unary calls are served and made.

Frames we write carry at most 4096 bytes: the Go side reads each frame into a buffer
that may be no larger than that.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from resmgr.generated.ttrpc import request_pb2 as ttrpc

log = logging.getLogger("cri-resmgr.nri")

PLUGIN_CONN = 1  # the runtime calls us (service Plugin)
RUNTIME_CONN = 2  # we call the runtime (service Runtime)
FRAME = struct.Struct(">II")
HEADER = struct.Struct(">IIBB")
MAX_MESSAGE = 4 << 20
MAX_FRAME = 4096
REQUEST, RESPONSE, DATA = 1, 2, 3

# gRPC status codes, as ttrpc uses them.
UNKNOWN, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, FAILED_PRECONDITION = 2, 3, 8, 9
UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 12, 13, 14


class RpcError(Exception):
    """A call answered with a non-OK status (or that a handler answers with one)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message


class ProtocolError(Exception):
    """The peer broke the framing: the trunk cannot be used any more."""


@dataclass
class Call:
    """An incoming unary call."""

    service: str
    method: str
    payload: bytes
    deadline: float | None  # time.monotonic(); None: the caller set none


Handler = Callable[[Call], Awaitable[bytes]]


class _Stream:
    """One logical connection's incoming bytes, cut into ttrpc messages."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.skip = 0  # bytes of an oversize message still to throw away

    def feed(self, data: bytes) -> list[tuple[int, int, int, bytes | None]]:
        """Append data; return the complete messages (stream ID, type, flags, data; None: oversize)."""
        if self.skip:
            dropped = min(self.skip, len(data))
            self.skip -= dropped
            data = data[dropped:]
        self.buf += data
        out: list[tuple[int, int, int, bytes | None]] = []
        while len(self.buf) >= HEADER.size:
            length, sid, kind, flags = HEADER.unpack_from(self.buf)
            if length > MAX_MESSAGE:
                held = len(self.buf) - HEADER.size
                self.skip = max(0, length - held)
                del self.buf[:HEADER.size + min(length, held)]
                out.append((sid, kind, flags, None))
                continue
            end = HEADER.size + length
            if len(self.buf) < end:
                break
            out.append((sid, kind, flags, bytes(self.buf[HEADER.size:end])))
            del self.buf[:end]
        return out


class Trunk:
    """Both ttrpc ends of an NRI connection on one socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler) -> None:
        self.reader = reader
        self.writer = writer
        self.handler = handler
        self._streams = {PLUGIN_CONN: _Stream(), RUNTIME_CONN: _Stream()}
        self._ids = itertools.count(1, 2)
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()
        self.error: BaseException | None = None

    # -- sending --------------------------------------------------------------------
    def _send(self, conn: int, sid: int, kind: int, data: bytes) -> None:
        if self._closed.is_set():
            raise ConnectionError("NRI connection is closed")
        msg = HEADER.pack(len(data), sid, kind, 0) + data
        view = memoryview(msg)
        for start in range(0, len(msg), MAX_FRAME):  # no await in between: frames stay in order
            chunk = view[start:start + MAX_FRAME]
            self.writer.write(FRAME.pack(conn, len(chunk)) + chunk)

    async def call(self, service: str, method: str, payload: bytes, timeout: float,
                   until_answered: bool = False) -> bytes:
        """A unary call to the runtime; RpcError for a non-OK answer, TimeoutError, ConnectionError.

        timeout goes to the runtime as the call's deadline, and is how long the answer is waited
        for here, unless until_answered: then until it comes or the connection ends."""
        sid = next(self._ids)
        req = ttrpc.Request(service=service, method=method, payload=payload, timeout_nano=int(timeout * 1e9))
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[sid] = fut
        try:
            self._send(RUNTIME_CONN, sid, REQUEST, req.SerializeToString())
            await self.writer.drain()
            async with asyncio.timeout(None if until_answered else timeout):
                return await fut
        finally:
            self._pending.pop(sid, None)

    def _respond(self, sid: int, payload: bytes = b"", code: int = 0, message: str = "") -> None:
        resp = ttrpc.Response(payload=payload)
        if code:
            resp.status.code, resp.status.message = code, message
        try:
            self._send(PLUGIN_CONN, sid, RESPONSE, resp.SerializeToString())
        except ConnectionError:
            log.debug("NRI connection closed before the answer to stream %d", sid)

    # -- receiving ------------------------------------------------------------------------
    async def run(self) -> None:
        """Read until the peer closes or breaks the protocol; then every pending call fails."""
        try:
            while True:
                head = await self.reader.readexactly(FRAME.size)
                conn, size = FRAME.unpack(head)
                if size > MAX_MESSAGE + HEADER.size:
                    raise ProtocolError(f"frame of {size} bytes on connection {conn} exceeds the limit")
                data = await self.reader.readexactly(size) if size else b""
                stream = self._streams.get(conn)
                if stream is None:
                    log.warning("NRI runtime sent %d bytes on unknown connection %d; dropped", size, conn)
                    continue
                for sid, kind, flags, body in stream.feed(data):
                    self._dispatch(conn, sid, kind, flags, body)
        except asyncio.IncompleteReadError:
            self.error = ConnectionError("NRI runtime closed the connection")
        except (ProtocolError, ConnectionError, OSError) as err:
            self.error = err
        finally:
            self.close()

    def _dispatch(self, conn: int, sid: int, kind: int, flags: int, body: bytes | None) -> None:
        if conn == PLUGIN_CONN:
            if kind != REQUEST:
                raise ProtocolError(f"message type {kind} on stream {sid} of the plugin connection")
            if sid % 2 == 0:
                raise ProtocolError(f"request on even stream {sid}")
            if body is None:
                log.warning("NRI request on stream %d exceeds %d bytes; refused", sid, MAX_MESSAGE)
                self._respond(sid, code=RESOURCE_EXHAUSTED, message=f"message exceeds {MAX_MESSAGE} bytes")
                return
            task = asyncio.create_task(self._serve(sid, body))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        fut = self._pending.get(sid)
        if kind != RESPONSE:
            raise ProtocolError(f"message type {kind} on stream {sid} of the runtime connection")
        if fut is None or fut.done():
            log.warning("NRI runtime answered stream %d, which has no call waiting; dropped", sid)
            return
        if body is None:
            fut.set_exception(RpcError(RESOURCE_EXHAUSTED, f"answer exceeds {MAX_MESSAGE} bytes"))
            return
        try:
            resp = ttrpc.Response.FromString(body)
        except DecodeError:
            fut.set_exception(RpcError(INTERNAL, "undecodable ttrpc response"))
            return
        if resp.status.code:
            fut.set_exception(RpcError(resp.status.code, resp.status.message))
        else:
            fut.set_result(resp.payload)

    async def _serve(self, sid: int, body: bytes) -> None:
        try:
            req = ttrpc.Request.FromString(body)
        except DecodeError:
            log.warning("NRI runtime sent an undecodable request on stream %d", sid)
            self._respond(sid, code=INVALID_ARGUMENT, message="undecodable ttrpc request")
            return
        deadline = time.monotonic() + req.timeout_nano / 1e9 if req.timeout_nano > 0 else None
        try:
            payload = await self.handler(Call(req.service, req.method, req.payload, deadline))
        except RpcError as err:
            self._respond(sid, code=err.code, message=err.message)
            return
        except DecodeError as err:
            log.warning("NRI %s.%s: undecodable request: %s", req.service, req.method, err)
            self._respond(sid, code=INVALID_ARGUMENT, message=f"undecodable {req.method} request")
            return
        except Exception as err:
            log.exception("NRI %s.%s failed", req.service, req.method)
            self._respond(sid, code=INTERNAL, message=f"{type(err).__name__}: {err}")
            return
        if len(payload) > MAX_MESSAGE:
            self._respond(sid, code=RESOURCE_EXHAUSTED, message=f"answer exceeds {MAX_MESSAGE} bytes")
            return
        self._respond(sid, payload)
        try:
            await self.writer.drain()
        except (ConnectionError, OSError):
            pass

    # -- closing ----------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError("NRI connection closed"))
        self.writer.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def wait_closed(self) -> None:
        await self._closed.wait()
