"""A document of the node's state as a stream for the node agent (the config link's WatchTopology,
its NodeResourceTopology, and WatchDevices, the DRA devices; resmgr/control/link.py): the document
now, then again whenever the state changed and the document with it, at most once per interval."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

MIN_INTERVAL = 0.2  # seconds: the floor between two documents, whatever is asked


class ChangeCount(Protocol):
    """The engine's count of state changes (resmgr.engine.state.Changes)."""

    count: int

    async def after(self, count: int) -> None: ...


@dataclass
class StateFeed:
    """The document now (JSON-able), and the changes to wait on."""

    document: Callable[[], Any]
    changes: ChangeCount

    async def texts(self, interval: float) -> AsyncIterator[str]:
        """The document as JSON text each time it differs from the last one sent."""
        interval = max(MIN_INTERVAL, interval)
        sent = ""
        while True:
            seen = self.changes.count
            text = json.dumps(self.document(), sort_keys=True)
            if text != sent:
                yield text
                sent = text
                await asyncio.sleep(interval)  # the rate limit: changes meanwhile are sent as one
            await self.changes.after(seen)
