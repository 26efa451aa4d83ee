"""Front ends: each translates one protocol to the engine's model calls and back.

The runtime's front ends (the CRI relay, the NRI plugin) are run the same way by the daemon
(resmgr/app/daemon.py): prepared, giving the engine its view of the runtime, bound to the engine,
started, running their loops under the daemon's task group, stopped and closed (`FrontEnd`
below); a third would be one class with these methods. kubelet's DRA driver (dra/) is not one
of them: it runs beside whichever does, started and stopped by the daemon, and asks the engine
for claims.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, Protocol

from resmgr.engine import Engine
from resmgr.engine.calls import HookPoints
from resmgr.engine.state import Runtime


class Closable(Protocol):
    def close(self) -> None: ...


class DumpSink(Protocol):
    """Where CRI message dumps go (the relay's): open a dumper for rules and a file, put it in use."""

    def open(self, rules: str, path: str | None) -> Closable: ...

    def use(self, dumper: Closable) -> None: ...


class StartupError(Exception):
    """The daemon cannot start as asked (a message for the operator)."""


class FrontEnd(Protocol):
    # Whether the engine's answers may go before its state is on disk (Engine's write_behind).
    write_behind: bool

    def prepare(self) -> None:
        """Check what it needs before the state is claimed (StartupError, SocketInUse)."""

    def runtime(self) -> Runtime:
        """The engine's view of the runtime."""

    def bind(self, engine: Engine, hooks: HookPoints | None) -> DumpSink | None:
        """Everything that needs the engine; returns where CRI message dumps go (None: nowhere)."""

    async def start(self) -> None:
        """Take calls from now on."""

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        """Background loops of its own, run until the daemon stops (one may end early)."""

    async def run(self) -> int:
        """Its main loop; returning ends the daemon with that exit code."""

    async def stop(self, grace: float) -> None:
        """Take no new calls; those in flight get grace seconds to finish."""

    async def close(self) -> None:
        """Give back what it holds (sockets, channels, files)."""

    def describe(self) -> str:
        """What it serves, for the log."""

    def serving(self) -> str:
        """Why it takes no runtime calls now ("": it does); status and probes report it."""
