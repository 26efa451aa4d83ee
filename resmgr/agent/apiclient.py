"""A small asyncio client for the Kubernetes API: JSON requests and watch streams.

The agent runs on every node, so what it costs is paid a thousand times over: it talks
HTTP/2 where the API server offers it (every watch and write of an agent is a stream on one
connection, as client-go's are), checks an idle connection with PINGs, and imports no more
than it uses (the kubernetes package alone is more memory than the whole agent may take).
Plain HTTP/1.1 (h11) serves `http://` servers and servers that do not offer HTTP/2.

Credentials come from a kubeconfig (token, token file or client certificate; a CA file or
data) or, without one, from the pod's ServiceAccount; a token file is read again every
minute, as bound tokens are rotated under a running pod.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import gc
import json
import logging
import os
import random
import ssl
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h11
import yaml

log = logging.getLogger("cri-resmgr-agent.api")

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REREAD = 60.0  # seconds between reads of a token file
PING_IDLE = 30.0  # a connection silent this long is PINGed...
PING_TIMEOUT = 15.0  # ...and closed when the PING is not answered in time
WINDOW = 1 << 20  # our receive window per stream
COLLECT_DELAY = 5.0  # seconds after a connection ended before its garbage is collected (_collect_soon)
RETRIES_WHEN_BUSY = 10  # tries of a request the server refused for want of room (429)
BUSY_WAIT = 0.5  # the shortest wait before such a retry, in seconds
DIAL_FIRST, DIAL_MAX = 1.0, 30.0  # after a failed connection, no new one for this long, doubling up to the most


class ApiError(Exception):
    """The API server answered with an error status (or the connection failed: status 0)."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}" + (f": {body[:300]}" if body else ""))
        self.status, self.reason, self.body = status, reason, body
        self.retry_after: float | None = None  # seconds the server asked us to wait before trying again


@dataclass
class Credentials:
    server: str  # https://host:port or http://host:port
    ca_file: str = ""
    insecure: bool = False
    token: str = ""
    token_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    tls_server_name: str = ""  # the name the server's certificate is checked against, if not the server's host
    # A kubeconfig's `*-data`: kept in memory, never left in a file.
    ca_data: bytes = field(default=b"", repr=False)
    cert_data: bytes = field(default=b"", repr=False)
    key_data: bytes = field(default=b"", repr=False)
    _token_read: float = field(default=0.0, repr=False)

    def bearer(self) -> str:
        if self.token_file and time.monotonic() - self._token_read > TOKEN_REREAD:
            with open(self.token_file) as f:
                self.token = f.read().strip()
            self._token_read = time.monotonic()
        return self.token

    def files_stamp(self) -> tuple[float, ...]:
        """When the CA and client certificate files last changed: a rotation makes a new TLS context."""
        stamps = []
        for path in (self.ca_file, self.cert_file, self.key_file):
            try:
                stamps.append(os.stat(path).st_mtime if path else 0.0)
            except OSError:
                stamps.append(-1.0)
        return tuple(stamps)

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file or None,
                                         cadata=self.ca_data.decode() if self.ca_data else None)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_data or self.key_data:
            _load_chain(ctx, self.cert_data or _read(self.cert_file), self.key_data or _read(self.key_file))
        elif self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file or None)
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        return ctx


def _read(path: str) -> bytes:
    if not path:
        return b""
    with open(path, "rb") as f:
        return f.read()


def _load_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """A client certificate and key from memory: the ssl module reads only files, so they are in
    a private directory for the moment it reads them and removed at once."""
    with tempfile.TemporaryDirectory(prefix="cri-resmgr-agent-") as secrets:
        os.chmod(secrets, 0o700)
        cert_path = os.path.join(secrets, "cert")
        key_path = os.path.join(secrets, "key") if key else None
        for path, data in ((cert_path, cert), (key_path, key)):
            if path:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
        ctx.load_cert_chain(cert_path, key_path)


def load_kubeconfig(path: str) -> Credentials:
    """The current context's cluster and user from a kubeconfig file."""
    with open(path) as f:
        doc = yaml.safe_load(f) or {}
    base = os.path.dirname(os.path.abspath(path))

    def named(section: str, name: str) -> dict[str, Any]:
        for item in doc.get(section) or []:
            if item.get("name") == name:
                return item.get(section[:-1]) or {}
        raise ValueError(f"{path}: no {section[:-1]} named {name!r}")

    ctx_name = doc.get("current-context") or ((doc.get("contexts") or [{}])[0].get("name"))
    ctx = named("contexts", ctx_name)
    cluster, user = named("clusters", ctx.get("cluster", "")), named("users", ctx.get("user", ""))
    if user.get("exec") or user.get("auth-provider"):
        raise ValueError(f"{path}: exec and auth-provider credentials are not supported; use a token or "
                         "a client certificate")

    def file_of(key: str, where: dict[str, Any]) -> str:
        value = where.get(key) or ""
        return os.path.join(base, value) if value and not where.get(f"{key}-data") else ""

    def data_of(key: str, where: dict[str, Any]) -> bytes:
        return base64.b64decode(where[f"{key}-data"]) if where.get(f"{key}-data") else b""

    if "server" not in cluster:
        raise ValueError(f"{path}: cluster {ctx.get('cluster')!r} names no server")
    return Credentials(server=cluster["server"].rstrip("/"), ca_file=file_of("certificate-authority", cluster),
                       ca_data=data_of("certificate-authority", cluster),
                       insecure=bool(cluster.get("insecure-skip-tls-verify")), token=user.get("token") or "",
                       token_file=file_of("tokenFile", user), cert_file=file_of("client-certificate", user),
                       cert_data=data_of("client-certificate", user), key_file=file_of("client-key", user),
                       key_data=data_of("client-key", user), tls_server_name=cluster.get("tls-server-name") or "")


def in_cluster() -> Credentials:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ValueError("not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    if ":" in host:
        host = f"[{host}]"
    token = os.path.join(SA_DIR, "token")
    if not os.path.exists(token):
        raise ValueError(f"no ServiceAccount token at {token}")
    return Credentials(server=f"https://{host}:{port}", ca_file=os.path.join(SA_DIR, "ca.crt"), token_file=token)


class _Stream:
    def __init__(self) -> None:
        self.headers: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
        # Received data with its flow-controlled length, acknowledged to the server only when read:
        # the receive window (WINDOW) bounds what waits here for a slow reader.
        self.chunks: asyncio.Queue[tuple[bytes, int] | BaseException | None] = asyncio.Queue()
        self.window = asyncio.Event()  # set when the server opens this stream's send window


REFUSED_RETRIES = 3  # a request a GOAWAY left unprocessed is sent again this often

class _Refused(ConnectionError):
    """The server did not process the stream (above a GOAWAY's last stream, or REFUSED_STREAM):
    it is safe to send again, whatever the method (RFC 9113, 8.7)."""


class _Draining(h2.connection.H2ConnectionStateMachine):
    """The h2 library takes a GOAWAY as the connection's end and refuses every frame after it, but
    the server still finishes the streams up to its last_stream_id (RFC 9113, 6.8): the connection
    stays open for them (no new stream starts on it: _H2.usable)."""

    _transitions = {**h2.connection.H2ConnectionStateMachine._transitions,
                    (h2.connection.ConnectionState.CLIENT_OPEN, h2.connection.ConnectionInputs.RECV_GOAWAY):
                        (None, h2.connection.ConnectionState.CLIENT_OPEN)}


_collecting: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None


def _collect_soon() -> None:
    """A full garbage collection shortly after a connection ended. A TLS connection's objects
    (asyncio's SSL protocol with its 256 KiB buffer, OpenSSL's own memory) end in reference cycles
    through the errors that ended it; an agent at rest allocates too little for the collector's
    oldest generation to run, so each API server restart kept one until then (about 0.25 MB each,
    measured). One collection for the connections ending together, after their closing is done."""
    global _collecting
    loop = asyncio.get_running_loop()
    if _collecting is None or _collecting[0] is not loop or _collecting[1].when() < loop.time():
        _collecting = loop, loop.call_later(COLLECT_DELAY, gc.collect)


class _H2:
    """One HTTP/2 connection; requests are streams on it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, authority: str) -> None:
        self.reader, self.writer, self.authority = reader, writer, authority
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.conn.state_machine = _Draining()
        self.conn.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW, h2.settings.SettingCodes.ENABLE_PUSH: 0})
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(16 * WINDOW)
        self.streams: dict[int, _Stream] = {}
        self.usable = True  # no GOAWAY, no error: new streams may start here
        self.closed = False
        self.pong = asyncio.Event()
        self.last_heard = time.monotonic()
        self._flush()
        self.task = asyncio.create_task(self._read())
        self.pinger = asyncio.create_task(self._ping())

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)

    async def _read(self) -> None:
        error: BaseException = ConnectionError("the API server closed the connection")
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                self.last_heard = time.monotonic()
                for event in self.conn.receive_data(data):
                    self._on(event)
                self._flush()
        except (OSError, h2.exceptions.ProtocolError) as err:
            error = ConnectionError(f"HTTP/2 connection: {err}")
        finally:
            self.close(error)

    def _on(self, event: h2.events.Event) -> None:
        stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived) and stream:
            stream.headers.set_result({k.decode(): v.decode() for k, v in event.headers})
        elif isinstance(event, h2.events.DataReceived):
            if stream:
                stream.chunks.put_nowait((event.data, event.flow_controlled_length))
            else:  # a stream given up: its window is of no use, the connection's is
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and stream:
            self._end(event.stream_id, None)
        elif isinstance(event, h2.events.StreamReset) and stream:
            kind = _Refused if event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM else ConnectionError
            self._end(event.stream_id, kind(f"stream reset by the API server ({event.error_code})"))
        elif isinstance(event, h2.events.WindowUpdated) and event.stream_id:
            if stream:
                stream.window.set()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            for s in self.streams.values():  # the connection's window, or every stream's initial one
                s.window.set()
        elif isinstance(event, h2.events.PingAckReceived):
            self.pong.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.usable = False  # GOAWAY: streams above last_stream_id were not processed
            for sid in [s for s in self.streams if s > (event.last_stream_id or 0)]:
                self._end(sid, _Refused("the API server is going away"))
            self._close_if_drained()

    def _end(self, stream_id: int, error: BaseException | None) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        if not stream.headers.done():
            stream.headers.set_exception(error or ConnectionError("stream ended without a response"))
        stream.chunks.put_nowait(error)
        self._close_if_drained()

    def _close_if_drained(self) -> None:
        """A going connection whose last stream ended is closed by us: the server may keep it open a
        while, and its buffers with it."""
        if not self.usable and not self.closed and not self.streams:
            self.writer.close()  # the reader ends and closes the rest

    async def _ping(self) -> None:
        while True:
            await asyncio.sleep(PING_IDLE / 3)
            if time.monotonic() - self.last_heard < PING_IDLE:
                continue
            self.pong.clear()
            self.conn.ping(os.urandom(8))
            self._flush()
            try:
                async with asyncio.timeout(PING_TIMEOUT):
                    await self.pong.wait()
            except TimeoutError:
                self.writer.close()  # the reader ends and fails every stream
                return

    def close(self, error: BaseException) -> None:
        self.usable, self.closed = False, True
        for sid in list(self.streams):
            self._end(sid, error)
        self.pinger.cancel()
        with contextlib.suppress(Exception):
            self.writer.close()
        _collect_soon()

    async def open(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, _Stream]:
        sid = self.conn.get_next_available_stream_id()
        stream = self.streams[sid] = _Stream()
        hdrs = [(":method", method), (":scheme", "https"), (":authority", self.authority), (":path", path),
                *headers.items()]
        self.conn.send_headers(sid, [(k.encode(), v.encode()) for k, v in hdrs], end_stream=not body)
        self._flush()
        while body:
            window = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if window <= 0:
                stream.window.clear()
                await stream.window.wait()
                if sid not in self.streams:
                    break
                continue
            chunk, body = body[:window], body[window:]
            self.conn.send_data(sid, chunk, end_stream=not body)
            self._flush()
        await self.writer.drain()
        return sid, stream

    def consumed(self, stream_id: int, length: int) -> None:
        """Data of a stream was read: the server may send as much again."""
        if not self.closed and length:  # a going connection still finishes the streams it keeps
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.conn.acknowledge_received_data(length, stream_id)
                self._flush()

    def cancel(self, stream_id: int, ended: _Stream | None = None) -> None:
        """Give a stream up (reset it if still open); what it held unread is acknowledged, or the
        connection's window would shrink by it for good."""
        stream = self.streams.pop(stream_id, None)
        held = stream or ended  # the same stream, unless the server ended it already
        unread = 0
        while held is not None and not held.chunks.empty():
            item = held.chunks.get_nowait()
            if isinstance(item, tuple):
                unread += item[1]
        self.consumed(stream_id, unread)
        if stream is not None and not self.closed:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                self._flush()


class Response:
    """A response whose body arrives in chunks (a watch, lines()) or at once (body())."""

    def __init__(self, status: int, reason: str, headers: dict[str, str], chunks: AsyncIterator[bytes],
                 closer: Any) -> None:
        self.status, self.reason, self.headers = status, reason, headers
        self._chunks, self._closer = chunks, closer

    async def body(self) -> bytes:
        return b"".join([c async for c in self._chunks])

    async def lines(self) -> AsyncIterator[bytes]:
        rest = b""
        async for chunk in self._chunks:
            rest += chunk
            *whole, rest = rest.split(b"\n")
            for line in whole:
                if line.strip():
                    yield line
        if rest.strip():
            yield rest

    def close(self) -> None:
        self._closer()

    async def error(self) -> ApiError:
        """An error status as ApiError: the reason the API server's Status gives, and the wait it
        asks for when it has no room for the request (429, or 503 with Retry-After: its flow control)."""
        text = (await self.body()).decode(errors="replace")
        reason = self.reason
        with contextlib.suppress(ValueError, AttributeError):
            reason = json.loads(text).get("reason") or reason
        error = ApiError(self.status, reason or "error", text)
        if self.status == 429 or (self.status == 503 and "retry-after" in self.headers):
            with contextlib.suppress(ValueError):
                error.retry_after = float(self.headers.get("retry-after") or 1)
        return error


class Client:
    """Requests to one API server, as one user. HTTP/2 when offered: one connection at a time for
    every request and watch; HTTP/1.1 otherwise: a connection per request."""

    def __init__(self, creds: Credentials, user_agent: str = "cri-resmgr-agent") -> None:
        self.creds, self.user_agent = creds, user_agent
        url = urlsplit(creds.server)
        self.tls = url.scheme == "https"
        self.host = url.hostname or "localhost"
        self.port = url.port or (443 if self.tls else 80)
        self.authority = url.netloc
        self.prefix = url.path.rstrip("/")
        self._ssl = creds.ssl_context() if self.tls else None
        self._ssl_stamp = creds.files_stamp()
        self._h2: _H2 | None = None
        self._no_h2 = False
        self._connecting = asyncio.Lock()
        # Every watch and write of the agent shares this: while the server cannot be reached, one
        # connection is tried now and then, not one per watch (a fleet's agents would storm it).
        self._dial_failures = 0
        self._dial_again = 0.0  # monotonic time before which no new connection is tried

    def _headers(self, content_type: str) -> dict[str, str]:
        headers = {"accept": "application/json", "user-agent": self.user_agent}
        token = self.creds.bearer()
        if token:
            headers["authorization"] = f"Bearer {token}"
        if content_type:
            headers["content-type"] = content_type
        return headers

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        wait = self._dial_again - time.monotonic()
        if wait > 0:
            raise ConnectionError(f"{self.creds.server} could not be reached; the next try in {wait:.1f}s")
        name = self.creds.tls_server_name or self.host
        if self.tls and (stamp := self.creds.files_stamp()) != self._ssl_stamp:
            try:  # a rotated CA or client certificate: new connections use it
                self._ssl, self._ssl_stamp = self.creds.ssl_context(), stamp
                log.info("the CA or client certificate changed; new connections use the new one")
            except (OSError, ssl.SSLError, ValueError) as err:  # half written, say: the next dial looks again
                log.warning("the CA or client certificate changed but cannot be read: %s", err)
        try:
            conn = await asyncio.open_connection(self.host, self.port, ssl=self._ssl,
                                                 server_hostname=name if self.tls else None, limit=1 << 20)
        except (OSError, ssl.SSLError):
            _collect_soon()  # a handshake that failed leaves its connection's objects in cycles too
            self._dial_failures += 1
            pause = min(DIAL_MAX, DIAL_FIRST * 2 ** (self._dial_failures - 1))
            self._dial_again = time.monotonic() + pause * random.uniform(0.5, 1.0)
            raise
        self._dial_failures, self._dial_again = 0, 0.0
        return conn

    async def _h2_conn(self) -> _H2 | None:
        if not self.tls or self._no_h2:
            return None
        async with self._connecting:
            if self._h2 is not None and self._h2.usable:
                return self._h2
            reader, writer = await self._connect()
            ssl_obj = writer.get_extra_info("ssl_object")
            if ssl_obj is None or ssl_obj.selected_alpn_protocol() != "h2":
                writer.close()
                self._no_h2 = True
                log.info("%s does not offer HTTP/2: HTTP/1.1, a connection per request", self.creds.server)
                return None
            self._h2 = _H2(reader, writer, self.authority)
            log.debug("HTTP/2 connection to %s", self.creds.server)
            return self._h2

    async def open(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None,
                   content_type: str = "application/json") -> Response:
        """Send a request; the response's headers are in, its body not yet read."""
        target = self.prefix + quote(path) + (("?" + urlencode(query)) if query else "")
        data = b"" if body is None else json.dumps(body).encode()
        headers = self._headers(content_type if body is not None else "")
        try:
            for attempt in range(REFUSED_RETRIES + 1):
                conn = await self._h2_conn()
                if conn is None:
                    return await self._h11(method, target, headers, data)
                sid, stream = await conn.open(method, target, {**headers, "content-length": str(len(data))}
                                              if body is not None else headers, data)
                try:
                    head = await stream.headers
                except _Refused:  # not processed: again, on a new connection (this one is going)
                    if attempt == REFUSED_RETRIES:
                        raise
                    continue
                except BaseException:  # timed out or cancelled: the stream is ours to end
                    conn.cancel(sid)
                    raise
                return Response(int(head[":status"]), "", head, self._h2_chunks(conn, sid, stream),
                                functools.partial(conn.cancel, sid, stream))
            raise AssertionError("unreachable")
        except (OSError, ConnectionError, h2.exceptions.ProtocolError, h11.ProtocolError) as err:
            raise ApiError(0, f"{type(err).__name__}: {err}") from err

    @staticmethod
    async def _h2_chunks(conn: _H2, sid: int, stream: _Stream) -> AsyncIterator[bytes]:
        while True:
            item = await stream.chunks.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise ApiError(0, str(item))
            data, length = item
            conn.consumed(sid, length)
            yield data

    async def _h11(self, method: str, target: str, headers: dict[str, str], data: bytes) -> Response:
        reader, writer = await self._connect()
        conn = h11.Connection(h11.CLIENT)
        hdrs = [("host", self.authority), *headers.items(), ("connection", "close")]
        if data:
            hdrs.append(("content-length", str(len(data))))
        out = conn.send(h11.Request(method=method, target=target, headers=hdrs))
        if data:
            out += conn.send(h11.Data(data=data))
        out += conn.send(h11.EndOfMessage())
        writer.write(out)
        await writer.drain()

        async def next_event() -> Any:
            while True:
                event = conn.next_event()
                if event is not h11.NEED_DATA:
                    return event
                conn.receive_data(await reader.read(65536))

        try:
            head = await next_event()
        except BaseException:
            writer.close()
            raise
        if not isinstance(head, h11.Response):
            writer.close()
            raise ConnectionError(f"unexpected HTTP/1.1 event {head!r}")

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while True:
                    event = await next_event()
                    if isinstance(event, h11.Data):
                        yield bytes(event.data)
                    elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                        return
            except (OSError, h11.ProtocolError) as err:
                raise ApiError(0, f"{type(err).__name__}: {err}") from err
            finally:
                writer.close()

        return Response(head.status_code, head.reason.decode(errors="replace"),
                        {k.decode().lower(): v.decode() for k, v in head.headers}, chunks(), writer.close)

    async def request(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None,
                      content_type: str = "application/json", timeout: float = 10.0) -> dict[str, Any]:
        """A whole request: the answer's JSON, or ApiError for an error status or a failed connection.
        A request the server has no room for (429, or 503 with Retry-After: its flow control) is sent
        again after the time it asks for, as client-go does; the waits spread with each retry, so a
        fleet refused together does not come back together."""
        for attempt in range(RETRIES_WHEN_BUSY):
            try:
                return await self._request(method, path, query, body, content_type, timeout)
            except ApiError as err:
                if err.retry_after is None or attempt == RETRIES_WHEN_BUSY - 1:
                    raise
                await asyncio.sleep(max(err.retry_after, BUSY_WAIT) * random.uniform(1, 2 ** min(attempt + 1, 4)))
        raise AssertionError("unreachable")

    async def _request(self, method: str, path: str, query: dict[str, Any] | None, body: Any,
                       content_type: str, timeout: float) -> dict[str, Any]:
        try:
            async with asyncio.timeout(timeout):
                resp = await self.open(method, path, query, body, content_type)
                try:
                    if resp.status >= 400:
                        raise await resp.error()
                    data = await resp.body()
                finally:
                    resp.close()
        except TimeoutError as err:
            raise ApiError(0, f"no answer in {timeout:g}s") from err
        return json.loads(data) if data else {}

    async def close(self) -> None:
        if self._h2 is not None:
            self._h2.close(ConnectionError("client closed"))
            self._h2 = None
