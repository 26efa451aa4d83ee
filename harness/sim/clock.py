"""Virtual time for the simulated node: an asyncio event loop whose clock the simulator owns.

The loop never waits: when nothing is ready it jumps to its next timer, so an hour of a node's
life takes as long as the code it runs. Work handed to threads (asyncio.to_thread: the state
file's writes, cgroup reads) runs inline, at the instant it is asked for, so that nothing
happens outside the loop's order. `time.monotonic` and `time.time` follow the loop's clock
while a simulation runs (the engine reads them directly for its hold-backs and lags).
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import time
from collections.abc import Callable, Iterator
from typing import Any

EPOCH = 1_800_000_000.0  # what time.time() says at virtual time 0


class Stuck(Exception):
    """Nothing is ready and no timer is set: every task waits on something that never comes."""


class _Selector(selectors.DefaultSelector):
    """Selects no file: a timeout advances the loop's clock instead of passing."""

    def __init__(self, loop: VirtualLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise Stuck("nothing ready and no timer set")
        if timeout > 0:
            self._loop.now += timeout
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_Selector(self))
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self.now

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        fut = self.create_future()
        try:
            fut.set_result(func(*args))
        except BaseException as err:  # handed to the awaiting task, as a thread's would be
            fut.set_exception(err)
        return fut


@contextlib.contextmanager
def virtual_time(loop: VirtualLoop) -> Iterator[None]:
    """time.monotonic() and time.time() read the loop's clock meanwhile."""
    saved = time.monotonic, time.time
    time.monotonic = loop.time  # type: ignore[assignment]
    time.time = lambda: EPOCH + loop.now  # type: ignore[assignment]
    try:
        yield
    finally:
        time.monotonic, time.time = saved  # type: ignore[assignment]
