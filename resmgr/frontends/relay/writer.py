"""Writing to the client: the runtime's frames and ours, in order and within the client's windows.

Frames of our own (answers to calls the relay answers, resets, window updates) are never
written before the runtime's SETTINGS nor inside a header block the runtime has begun:
they wait (parked) until it ends. DATA of ours counts against the client's connection and
stream windows, which are enforced here because the runtime does not know about these
bytes; the runtime's idea of the connection window is kept no larger than the real one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from resmgr.frontends.relay import frames as h2

log = logging.getLogger("cri-resmgr.relay")

MAX_UNREAD = 16 << 20  # bytes a client may leave unread before it is cut off


class Budget:
    """Bytes held for calls answered here: one connection's, and all connections' together."""

    __slots__ = ("held", "limit", "shared")

    def __init__(self, shared: Budget | None = None, limit: int = 0) -> None:
        self.held = 0
        self.limit = limit
        self.shared = shared

    def charge(self, n: int) -> None:
        """Count n more bytes (fewer, if negative)."""
        self.held += n
        if self.shared is not None:
            self.shared.held += n

    def allows(self, n: int) -> bool:
        shared = self.shared
        return self.held + n <= self.limit and (shared is None or shared.held + n <= shared.limit)


class ClientWriter:
    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.back_hdr_open = False  # the runtime is inside a header block
        self.back_ready = False  # the runtime's SETTINGS must be the first frame the client sees
        self.out: deque[tuple[bytes, int, int]] = deque()  # (bytes, flow-controlled length, stream)
        self.parked: list[tuple[bytes, int, int]] = []  # our frames waiting for a header block to end
        self.cwin = h2.DEFAULT_WINDOW  # the client's connection receive window, as it really is
        self.debt = 0  # bytes we sent that the runtime still counts as window
        self.swin: dict[int, int] = {}  # the client's receive windows of streams we answer
        self.queued: dict[int, int] = {}  # reply bytes of streams we answer, not yet written

    def inject(self, data: bytes, flow: int = 0, sid: int = 0) -> None:
        """Queue a frame of our own. flow: its flow-controlled length; sid < 0: the last frame of
        stream -sid, whose window is then forgotten."""
        if flow and sid > 0:  # reply bytes count against the budgets until written
            self.queued[sid] = self.queued.get(sid, 0) + flow
            self.budget.charge(flow)
        (self.parked if self.back_hdr_open or not self.back_ready else self.out).append((data, flow, sid))

    def unpark(self) -> None:
        """The runtime's header block has ended: frames held back go next."""
        self.out.extend(self.parked)
        self.parked.clear()

    def drain(self) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            return
        q = self.out
        chunks = []
        while q:
            data, flow, sid = q[0]
            if flow:
                if flow > self.cwin:
                    break
                if sid > 0:
                    window = self.swin.get(sid, 0)
                    if flow > window:
                        break
                    self.swin[sid] = window - flow
                    self.debt += flow
                    self.budget.charge(-flow)
                    left = self.queued[sid] - flow
                    if left:
                        self.queued[sid] = left
                    else:
                        del self.queued[sid]
                self.cwin -= flow
            elif sid < 0:
                self.swin.pop(-sid, None)
            chunks.append(data)
            q.popleft()
        if chunks:
            self.transport.write(b"".join(chunks))
            if self.transport.get_write_buffer_size() > MAX_UNREAD:
                log.warning("client leaves more than %d bytes unread; closing the connection", MAX_UNREAD)
                self.transport.abort()

    def window_update(self, sid: int, inc: int, raw: bytes | bytearray, out: list[bytes] | None) -> None:
        """The client's WINDOW_UPDATE; what the runtime must see of it goes to out (None: no runtime)."""
        if sid == 0:
            self.cwin += inc
            if self.debt:
                # Keep the runtime's idea of the window no larger than the real one.
                paid = min(self.debt, inc)
                self.debt -= paid
                inc -= paid
                if inc and out is not None:
                    out.append(h2.window_update(0, inc))
            elif out is not None:
                out.append(raw)
        elif sid in self.swin:
            self.swin[sid] += inc
        elif out is not None:
            out.append(raw)

    def drop(self, sid: int) -> None:
        """The client reset a stream we answer: what is still queued for it is never sent."""
        self.swin.pop(sid, None)
        left = self.queued.pop(sid, 0)
        if left:
            self.budget.charge(-left)
        if any(abs(s) == sid for _, _, s in self.out):
            kept = [f for f in self.out if abs(f[2]) != sid]
            self.out.clear()
            self.out.extend(kept)
        self.parked[:] = [f for f in self.parked if abs(f[2]) != sid]

    def close(self) -> None:
        """The connection is gone: nothing queued is sent, and it holds no bytes any more."""
        self.closed = True
        self.out.clear()
        self.parked.clear()
        self.budget.charge(-sum(self.queued.values()))
        self.queued.clear()
