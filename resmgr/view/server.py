"""The daemon's HTTP endpoint: /metrics, /api/v1/state and the live picture at /.

It runs on the daemon's event loop, so the state it shows is read between two engine steps and
never half-changed. What costs CPU is moved off the loop: the Prometheus text is rendered and
the state JSON encoded in a worker thread, from a snapshot taken on the loop. The endpoint shows
every pod of the node, so it listens on loopback or a unix socket unless the operator allows
more (--metrics-allow-remote).

HTTP/1.1 is spoken with h11 (the protocol, sans I/O) over asyncio streams: five GET routes do
not need a web framework, and aiohttp's cost the daemon about 10 MB of RSS at rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import os
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

import h11
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from resmgr import metrics, sockets
from resmgr.metrics_state import StateCollector
from resmgr.view.address import Address

log = logging.getLogger("cri-resmgr.view")

PAGE_FILES = {"/": ("index.html", "text/html"), "/picture.js": ("picture.js", "text/javascript")}
IDLE = 60.0  # a connection with no complete request for this long is closed (slow or stuck clients)
MAX_HEAD = 16 * 1024  # a request's line and headers
READ = 64 * 1024

Reply = tuple[int, bytes, list[tuple[str, str]]]


def page(name: str) -> bytes:
    return resources.files("resmgr.view").joinpath("page", name).read_bytes()


class ViewServer:
    """Serves snapshots of the node: `snapshot()` returns the state document (on the loop)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], address: Address) -> None:
        self.snapshot = snapshot
        self.address = address
        self.collector = StateCollector(snapshot)
        metrics.REGISTRY.register(self.collector)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._pages = {path: (page(name), kind) for path, (name, kind) in PAGE_FILES.items()}
        self._routes: dict[str, Callable[[], Awaitable[Reply]]] = {
            "/metrics": self._metrics, "/api/v1/state": self._state, "/healthz": self._health}

    async def start(self) -> None:
        if self.address.path:
            sockets.prepare(self.address.path)
            self._server = await asyncio.start_unix_server(self._accept, path=self.address.path)
            os.chmod(self.address.path, 0o660)
        else:
            self._server = await asyncio.start_server(self._accept, self.address.host or None, self.address.port,
                                                      reuse_address=True)
        log.info("serving metrics, state and the node picture on %s", self.address)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()
        if self.address.path:
            Path(self.address.path).unlink(missing_ok=True)
        metrics.REGISTRY.unregister(self.collector)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away, or said nothing for IDLE seconds
        except asyncio.CancelledError:
            pass  # stop(): the connection ends here (asyncio logs a handler that ends cancelled)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests one after the other on a connection (keep-alive), until either side closes."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        while True:
            try:
                request = await self._next_event(conn, reader)
                if not isinstance(request, h11.Request):
                    return  # closed
                while not isinstance(body := await self._next_event(conn, reader), h11.EndOfMessage):
                    if isinstance(body, h11.ConnectionClosed):
                        return  # a body cut short (GET has none worth reading anyway)
            except h11.RemoteProtocolError as err:
                with contextlib.suppress(h11.LocalProtocolError):
                    await self._send(conn, writer, "GET", (err.error_status_hint, b"bad request\n", []))
                return
            method = request.method.decode("ascii", "replace")
            route = request.target.decode("ascii", "replace").partition("?")[0]
            await self._send(conn, writer, method, await self._answer(method, route))
            if conn.our_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()

    @staticmethod
    async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            async with asyncio.timeout(IDLE):
                conn.receive_data(await reader.read(READ))

    async def _answer(self, method: str, route: str) -> Reply:
        if method not in ("GET", "HEAD"):
            return 405, b"only GET\n", [("Allow", "GET, HEAD")]
        if route in self._pages:
            body, kind = self._pages[route]
            return 200, body, [("Content-Type", kind), ("Cache-Control", "no-cache")]
        handler = self._routes.get(route)
        if handler is None:
            return 404, b"not found\n", []
        try:
            return await handler()
        except Exception:  # a defect of ours: the scraper hears of it, the daemon goes on
            log.exception("serving %s failed", route)
            return 500, b"internal error\n", []

    @staticmethod
    async def _send(conn: h11.Connection, writer: asyncio.StreamWriter, method: str, reply: Reply) -> None:
        status, body, headers = reply
        headers = [("Content-Length", str(len(body))), *headers]
        if not any(k == "Content-Type" for k, _ in headers):
            headers.append(("Content-Type", "text/plain; charset=utf-8"))
        writer.write(conn.send(h11.Response(status_code=status, headers=headers,
                                            reason=http.HTTPStatus(status).phrase.encode())))
        if method != "HEAD":
            writer.write(conn.send(h11.Data(data=body)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()

    async def _metrics(self) -> Reply:
        self.collector.refresh()  # on the loop: a consistent moment
        body = await asyncio.to_thread(generate_latest, metrics.REGISTRY)
        return 200, body, [("Content-Type", CONTENT_TYPE_LATEST)]

    async def _state(self) -> Reply:
        doc = self.snapshot()
        body = await asyncio.to_thread(json.dumps, doc)
        return 200, body.encode(), [("Content-Type", "application/json"), ("Cache-Control", "no-store")]

    async def _health(self) -> Reply:
        return 200, b"ok\n", []
