"""The NRI front end as the daemon runs it: a plugin of the runtime."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from resmgr.engine import Engine
from resmgr.engine.calls import HookPoints
from resmgr.frontends import DumpSink, StartupError
from resmgr.frontends.nri import connect
from resmgr.frontends.nri.connect import Endpoint
from resmgr.frontends.nri.plugin import NriPlugin
from resmgr.frontends.nri.runtime import NriRuntime


class NriFrontEnd:
    write_behind = True  # the runtime waits for every answer; Synchronize heals a lost write

    def __init__(self, socket: str, name: str, index: str) -> None:
        self.socket, self.name, self.index = socket, name, index
        self.nri_runtime = NriRuntime()
        self.plugin: NriPlugin | None = None
        self.endpoint: Endpoint | None = None

    def prepare(self) -> None:
        try:
            self.endpoint = Endpoint.from_environment(self.socket, self.name, self.index)
        except ValueError as err:
            raise StartupError(str(err)) from None

    def runtime(self) -> NriRuntime:
        return self.nri_runtime

    def bind(self, engine: Engine, hooks: HookPoints | None) -> DumpSink | None:
        self.nri_runtime.on_failure = engine.state.retry
        self.plugin = NriPlugin(engine, self.nri_runtime, hooks)
        return None  # no CRI messages to dump

    async def start(self) -> None:
        pass  # the runtime's Synchronize reconciles, once connected (run)

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        return [self.nri_runtime.run_sender()]

    async def run(self) -> int:
        assert self.plugin is not None and self.endpoint is not None
        return await connect.serve(self.plugin, self.endpoint)

    async def stop(self, grace: float) -> None:
        pass  # its connection ended with run(): the runtime holds no call of ours open

    async def close(self) -> None:
        pass

    def describe(self) -> str:
        ep = self.endpoint
        assert ep is not None
        where = "an inherited socket" if ep.inherited_fd is not None else ep.socket_path
        return f"NRI plugin {ep.index}-{ep.name} for the runtime on {where}"

    def serving(self) -> str:
        if self.plugin is None or not self.plugin.synchronized:
            where = self.endpoint.socket_path if self.endpoint is not None else self.socket
            return f"not registered with the runtime (NRI socket {where})"
        return ""
