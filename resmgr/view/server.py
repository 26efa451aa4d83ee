"""The daemon's HTTP endpoint: /metrics, /api/v1/state and the live picture at /.

It runs on the daemon's event loop (aiohttp), so the state it shows is read between two
engine steps and never half-changed. What costs CPU is moved off the loop: the Prometheus
text is rendered and the state JSON encoded in a worker thread, from a snapshot taken on
the loop. The endpoint shows every pod of the node, so it listens on loopback or a unix
socket unless the operator allows more (--metrics-allow-remote).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from resmgr import metrics, sockets
from resmgr.metrics_state import StateCollector
from resmgr.view.address import Address

log = logging.getLogger("cri-resmgr.view")

PAGE_FILES = {"/": ("index.html", "text/html"), "/picture.js": ("picture.js", "text/javascript")}


def page(name: str) -> bytes:
    return resources.files("resmgr.view").joinpath("page", name).read_bytes()


class ViewServer:
    """Serves snapshots of the node: `snapshot()` returns the state document (on the loop)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], address: Address) -> None:
        self.snapshot = snapshot
        self.address = address
        self.collector = StateCollector(snapshot)
        metrics.REGISTRY.register(self.collector)
        self._runner: web.AppRunner | None = None
        self._pages = {path: (page(name), kind) for path, (name, kind) in PAGE_FILES.items()}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/api/v1/state", self._state)
        app.router.add_get("/healthz", self._health)
        for path in self._pages:
            app.router.add_get(path, self._page)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        if self.address.path:
            sockets.prepare(self.address.path)
            site: web.BaseSite = web.UnixSite(self._runner, self.address.path)
            await site.start()
            os.chmod(self.address.path, 0o660)
        else:
            site = web.TCPSite(self._runner, self.address.host or None, self.address.port, reuse_address=True)
            await site.start()
        log.info("serving metrics, state and the node picture on %s", self.address)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self.address.path:
            Path(self.address.path).unlink(missing_ok=True)
        metrics.REGISTRY.unregister(self.collector)

    async def _metrics(self, request: web.Request) -> web.Response:
        self.collector.refresh()  # on the loop: a consistent moment
        body = await asyncio.to_thread(generate_latest, metrics.REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _state(self, request: web.Request) -> web.Response:
        doc = self.snapshot()
        body = await asyncio.to_thread(json.dumps, doc)
        return web.Response(body=body.encode(), content_type="application/json",
                            headers={"Cache-Control": "no-store"})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _page(self, request: web.Request) -> web.Response:
        body, kind = self._pages[request.path]
        return web.Response(body=body, content_type=kind, headers={"Cache-Control": "no-cache"})
