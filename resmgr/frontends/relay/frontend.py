"""The CRI relay as the daemon runs it: kubelet's socket in front of the runtime's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc

from resmgr import sockets
from resmgr.engine import Engine
from resmgr.engine.calls import HookPoints
from resmgr.frontends import StartupError
from resmgr.frontends.cri import events
from resmgr.frontends.cri.runtime import CriRuntime, RuntimeClient
from resmgr.frontends.relay import memory
from resmgr.frontends.relay.dispatch import Dispatcher
from resmgr.frontends.relay.dump import DumpSink
from resmgr.frontends.relay.proxy import CHANNEL_OPTIONS, SERVER_OPTIONS, Relay
from resmgr.frontends.relay.splice import SpliceServer

log = logging.getLogger("cri-resmgr")

TESTED_RUNTIMES = ("containerd", "cri-o")
RETRY_INTERVAL = 1.0  # seconds between start-up attempts while the runtime is away
FIRST_WAIT = 2.0  # how long start-up waits for the runtime before serving anyway


class RelayFrontEnd:
    write_behind = False  # kubelet may give up on an answer: the state is written first

    def __init__(self, relay_socket: str, runtime_socket: str, image_socket: str = "", mode: str = "splice",
                 allow_untested: bool = False, runtime_events: bool = True) -> None:
        self.relay_socket = sockets.path_of(relay_socket)
        self.runtime_socket = sockets.path_of(runtime_socket)
        self.image_socket = sockets.path_of(image_socket) if image_socket and image_socket != "default" \
            else self.runtime_socket
        self.mode = mode
        self.allow_untested = allow_untested
        self.runtime_events = runtime_events
        self.dispatcher: Dispatcher | None = None
        self.engine: Engine | None = None
        self._stop_server: Callable[[float], Awaitable[None]] | None = None
        self._pending_check = False  # the runtime was away at start-up: run() goes on trying

    def prepare(self) -> None:
        memory.tune()
        sockets.prepare(self.relay_socket)
        self.runtime_ch = grpc.aio.insecure_channel(sockets.target(self.runtime_socket), options=CHANNEL_OPTIONS)
        self.image_ch = self.runtime_ch if self.image_socket == self.runtime_socket else \
            grpc.aio.insecure_channel(sockets.target(self.image_socket), options=CHANNEL_OPTIONS)
        self.client = RuntimeClient(self.runtime_ch)

    def runtime(self) -> CriRuntime:
        return CriRuntime(self.client)

    def bind(self, engine: Engine, hooks: HookPoints | None) -> DumpSink:
        self.engine = engine
        self.dispatcher = Dispatcher(engine, self.runtime_ch, self.image_ch, None, self.runtime_socket,
                                     self.image_socket, hooks)
        return DumpSink(self.dispatcher)

    async def start(self) -> None:
        """Check the runtime and reconcile once (or go on trying in run()), then serve kubelet's socket."""
        try:
            async with asyncio.timeout(FIRST_WAIT):
                await self._check_runtime()
        except StartupError:
            raise
        except Exception as err:  # whatever the runtime holds or does, start-up goes on
            detail = err.details() if isinstance(err, grpc.aio.AioRpcError) else str(err) or "timed out"
            log.warning("runtime on %s not reachable, slow or odd (%s); serving anyway, lifecycle calls wait "
                        "until it is reconciled", self.runtime_socket, detail)
            self._pending_check = True
        assert self.dispatcher is not None
        if self.mode == "grpc":
            server = grpc.aio.server(options=SERVER_OPTIONS)
            server.add_generic_rpc_handlers([Relay(self.dispatcher)])
            server.add_insecure_port("unix:" + self.relay_socket)
            await server.start()
            self._stop_server = server.stop
        else:
            splice = SpliceServer(self.dispatcher, self.runtime_socket, self.image_socket)
            await splice.start(self.relay_socket)
            self._stop_server = splice.stop
        sockets.match_runtime(self.relay_socket, self.runtime_socket)

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        assert self.engine is not None
        loops = [self._watch_runtime(self.engine)]
        if self.runtime_events:
            loops.append(events.follow(self.engine, self.client))
        return loops

    async def run(self) -> int:
        """Until stopped; 1 if the runtime turns out to be one we must not relay to."""
        while self._pending_check:
            try:
                await self._check_runtime()
                self._pending_check = False
            except StartupError as err:
                log.error("%s", err)
                return 1
            except grpc.aio.AioRpcError as err:
                log.debug("runtime not ready yet: %s", err.details())
            except Exception:
                log.exception("reconciliation with the runtime failed; retrying")
            if self._pending_check:
                await asyncio.sleep(RETRY_INTERVAL)
        await asyncio.Event().wait()
        return 0

    async def stop(self, grace: float) -> None:
        if self._stop_server is not None:
            await self._stop_server(grace)

    async def close(self) -> None:
        Path(self.relay_socket).unlink(missing_ok=True)
        if self.dispatcher is not None and self.dispatcher.dumper is not None:
            self.dispatcher.dumper.close()
        if hasattr(self, "runtime_ch"):
            await self.runtime_ch.close()
            if self.image_ch is not self.runtime_ch:
                await self.image_ch.close()

    def describe(self) -> str:
        return f"relaying {self.relay_socket} -> runtime {self.runtime_socket}, images {self.image_socket}, " \
               f"{self.mode} front end"

    def serving(self) -> str:
        if self._stop_server is None:
            return "not listening on " + self.relay_socket + " yet"
        if self._pending_check:
            return "the runtime on " + self.runtime_socket + " not reconciled with yet"
        return ""

    async def _check_runtime(self) -> None:
        assert self.engine is not None
        version = await self.client.version()
        name = version.runtime_name
        if name not in TESTED_RUNTIMES:
            msg = f"runtime {name!r} {version.runtime_version} is not a tested runtime " \
                  f"({', '.join(TESTED_RUNTIMES)}); use --allow-untested-runtimes to proceed"
            if not self.allow_untested:
                raise StartupError(msg)
            log.warning("%s", msg)
        log.info("runtime %s %s (CRI %s) on %s", name, version.runtime_version,
                 version.runtime_api_version, self.runtime_socket)
        await self.engine.reconcile()

    async def _watch_runtime(self, engine: Engine) -> None:
        """Reconcile as soon as the runtime is back after its connection was lost (a restart)."""
        channel = self.runtime_ch
        lost = False
        state = channel.get_state(try_to_connect=True)
        while True:
            if state == grpc.ChannelConnectivity.READY:
                if lost:
                    log.info("runtime connection is back; reconciling")
                    engine.state.wake()
                lost = False
            elif state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.IDLE):
                lost = True
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=True)
