"""Metrics of the calls the splice front end passes through as bytes.

Only built when metrics are on. The runtime's header blocks are HPACK-decoded (the
dynamic table makes every block count, not only trailers) to read each call's
grpc-status; a block that does not decode stops the counting of that connection rather
than guess.
"""

from __future__ import annotations

import logging
import time

import grpc
import hpack
from hpack.exceptions import HPACKError

from resmgr import metrics
from resmgr.frontends.relay import frames as h2
from resmgr.frontends.relay.methods import method_label

log = logging.getLogger("cri-resmgr.relay")

CODES = {code.value[0]: code.name for code in grpc.StatusCode}
MAX_CALLS = 10000  # calls in flight one connection keeps track of


class PassMetrics:
    def __init__(self) -> None:
        self.calls: dict[int, tuple[str, float]] = {}  # stream -> method, start
        self.decoder = hpack.Decoder()
        self.decoder.max_allowed_table_size = 1 << 16
        self.decoder.max_header_list_size = 1 << 20
        self.broken = False
        self.block = bytearray()
        self.block_stream = 0
        self.block_ends_stream = False
        self.cache: dict[bytes, list[tuple[bytes, bytes]]] = {}

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """Decode a block, from a cache when that is safe.

        A block of one-byte indexed fields only reads the dynamic table, so as long as no
        other block changed the table, the same bytes mean the same headers. In steady state
        a runtime sends just such blocks (`:status`, content-type, grpc-status), and decoding
        them again each time would be most of what the counting costs.
        """
        if 0xFF not in block and all(b & 0x80 for b in block):
            headers = self.cache.get(block)
            if headers is None:
                if len(self.cache) > 64:
                    self.cache.clear()
                headers = self.cache[block] = self.decoder.decode(block, raw=True)
            return headers
        self.cache.clear()  # a literal or a table size update: what the cache knows may be stale
        return self.decoder.decode(block, raw=True)

    def started(self, sid: int, path: str) -> None:
        if len(self.calls) >= MAX_CALLS:  # streams the runtime never ended: forget the oldest
            del self.calls[next(iter(self.calls))]
        self.calls[sid] = (method_label(path), time.perf_counter())

    def ended(self, sid: int, code: str) -> None:
        call = self.calls.pop(sid, None)
        if call is not None:
            metrics.cri_call(call[0], "passthrough", code, time.perf_counter() - call[1])

    def header_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        """A HEADERS or CONTINUATION frame from the runtime."""
        if self.broken:
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
            headers = self._decode(bytes(self.block))
        except (HPACKError, ValueError) as err:
            log.debug("pass-through call outcomes no longer read on this connection: %s", err)
            self.broken = True
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
