"""When reconciliation tries again what the runtime failed (an update it refused, moves it has
not confirmed): at once the first time, then after a delay that doubles with each retry in a row.

Without it a runtime that lists containers but fails one container's updates (a container it is
stopping, say) met a retry that woke a round whose push failed and woke the next at once: a
loop that held a CPU and logged each round for as long as the failure lasted. A failure can be
known after its round (the NRI plugin's UpdateContainers answers later), so a run of retries
ends with quiet, not with a round that asked none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

FIRST = 0.5  # seconds before the second retry in a row
MOST = 10.0  # ... and at most (the reconciliation's default interval)


class Retry:
    def __init__(self, wake: Callable[[], None], first: float = FIRST, most: float = MOST) -> None:
        self._wake = wake
        self.first, self.most = first, most
        self.asked = 0  # retries asked for in a row
        self._last = -float("inf")  # when the last was asked for (the loop's clock)
        self._due: asyncio.TimerHandle | None = None

    def __call__(self) -> None:
        """Something failed that a reconciliation round tries again."""
        if self._due is not None:
            return  # a retry is due already: it covers this one
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now - self._last > 2 * self.most:
            self.asked = 0  # quiet since the last: this one is new
        self._last = now
        delay = 0.0 if not self.asked else min(self.first * 2 ** (self.asked - 1), self.most)
        self.asked += 1
        if not delay:
            self._wake()
            return
        self._due = loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._due = None
        self._wake()
