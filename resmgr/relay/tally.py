"""Metrics of the calls the splice front end passes through as bytes.

Only built when metrics are on. The runtime's header blocks are HPACK-decoded (the
dynamic table makes every block count, not only trailers) to read each call's
grpc-status; a block that does not decode stops the tally of that connection rather
than guess.
"""

from __future__ import annotations

import logging
import time

import grpc
import hpack
from hpack.exceptions import HPACKError

from resmgr import metrics
from resmgr.relay import frames as h2
from resmgr.relay.methods import short_name

log = logging.getLogger("cri-resmgr.relay")

CODES = {code.value[0]: code.name for code in grpc.StatusCode}
MAX_CALLS = 10000  # calls in flight one connection keeps track of


class Tally:
    def __init__(self) -> None:
        self.calls: dict[int, tuple[str, float]] = {}  # stream -> method, start
        self.decoder: hpack.Decoder | None = hpack.Decoder()
        self.decoder.max_allowed_table_size = 1 << 16
        self.decoder.max_header_list_size = 1 << 20
        self.block = bytearray()
        self.block_stream = 0
        self.block_ends_stream = False

    def started(self, sid: int, path: str) -> None:
        if len(self.calls) >= MAX_CALLS:  # streams the runtime never ended: forget the oldest
            del self.calls[next(iter(self.calls))]
        self.calls[sid] = (short_name(path), time.perf_counter())

    def ended(self, sid: int, code: str) -> None:
        call = self.calls.pop(sid, None)
        if call is not None:
            metrics.cri_call(call[0], "passthrough", code, time.perf_counter() - call[1])

    def header_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        """A HEADERS or CONTINUATION frame from the runtime."""
        if self.decoder is None:
            if ftype == h2.HEADERS and flags & h2.END_STREAM:
                self.ended(sid, "UNKNOWN")
            return
        try:
            if ftype == h2.HEADERS:
                self.block = bytearray(h2.unpad(flags, payload, priority=True))
                self.block_stream, self.block_ends_stream = sid, bool(flags & h2.END_STREAM)
            else:
                self.block += payload
            if not flags & h2.END_HEADERS:
                return
            headers = self.decoder.decode(bytes(self.block), raw=True)
        except (HPACKError, ValueError) as err:
            log.debug("pass-through call outcomes no longer read on this connection: %s", err)
            self.decoder = None
            if self.block_ends_stream:
                self.ended(self.block_stream, "UNKNOWN")
            return
        finally:
            if flags & h2.END_HEADERS:
                self.block = bytearray()
        if self.block_ends_stream:
            status = next((v for k, v in headers if k == b"grpc-status"), None)
            code = CODES.get(int(status), "UNKNOWN") if status is not None and status.isdigit() else "UNKNOWN"
            self.ended(self.block_stream, code)
