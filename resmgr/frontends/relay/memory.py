"""Giving memory back to the system after large requests.

Two things keep a Python daemon's memory high after a burst of big requests: glibc's
dynamic mmap threshold (after a big buffer is freed, later ones come from a heap it
seldom trims), and reference cycles (a failed call's traceback holding its request)
that the cyclic collector never visits while an idle process allocates nothing. The
first is switched off at start; the second is handled by one collection shortly after
a big request, never on a timer (a full collection stops the event loop for tens of ms).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging

log = logging.getLogger("cri-resmgr")

BIG = 1 << 20  # a request at least this large asks for a collection afterwards
DELAY = 1.0  # seconds after the last big request of a burst
MAX_DELAY = 5.0  # ... but no later than this after its first one

_libc: ctypes.CDLL | None = None
_pending: asyncio.TimerHandle | None = None
_first = 0.0


def tune() -> None:
    """Fix glibc's mmap threshold, so freed big buffers leave the process (a no-op elsewhere)."""
    global _libc
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD; setting it turns the dynamic one off
        libc.malloc_trim  # noqa: B018 - glibc only
        _libc = libc
    except (OSError, AttributeError):
        _libc = None


def after_big_request() -> None:
    """Collect cycles and trim the heap once a burst of big requests is over."""
    global _pending, _first
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop: nothing to schedule on
        return
    if _pending is None:
        _first = loop.time()
    elif loop.time() - _first < MAX_DELAY:
        _pending.cancel()
    else:
        return
    _pending = loop.call_later(DELAY, _collect)


def _collect() -> None:
    global _pending
    _pending = None
    gc.collect()
    if _libc is not None:
        _libc.malloc_trim(0)
