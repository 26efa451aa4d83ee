"""HTTP/2 framing helpers for the splicing relay (RFC 9113, RFC 7541).

Only what the relay needs: frame headers, stripping padding, building frames, and a
stateless HPACK encoding (literal header fields without indexing) so frames the relay
writes itself never change the peer's decoder state.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5

NO_ERROR, PROTOCOL_ERROR, REFUSED_STREAM, CANCEL = 0x0, 0x1, 0x7, 0x8
FRAME_SIZE_ERROR, ENHANCE_YOUR_CALM = 0x6, 0xB

DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384


def split_frames(buf: bytearray, pos: int) -> Iterator[tuple[int, int, int, int]]:
    """(start, end, type, flags) of each complete frame in buf from pos on."""
    n = len(buf)
    while n - pos >= 9:
        end = pos + 9 + (buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2])
        if end > n:
            return
        yield pos, end, buf[pos + 3], buf[pos + 4]
        pos = end


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return bytes((n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF, ftype, flags)) + \
        (stream & 0x7FFFFFFF).to_bytes(4, "big") + payload


def unpad(flags: int, payload: bytes, priority: bool = False) -> bytes:
    """The fragment of a DATA or HEADERS payload without padding and priority fields."""
    start, end = 0, len(payload)
    if flags & PADDED:
        if not payload:
            raise ValueError("padded frame without pad length")
        start, end = 1, len(payload) - payload[0]
    if priority and flags & PRIORITY_FLAG:
        start += 5
    if end < start:
        raise ValueError("padding exceeds frame payload")
    return payload[start:end]


def parse_settings(payload: bytes) -> dict[int, int]:
    return {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
            for i in range(0, len(payload) - len(payload) % 6, 6)}


def _int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Encoded fields seen lately: most of a call's headers repeat from call to call. Only short
# ones are kept, so the cache stays small whatever clients send (at most about 1 MiB).
_FIELDS: dict[tuple[bytes, bytes], bytes] = {}
_FIELDS_KEPT = 4096
_FIELD_MAX = 256


def _field(name: bytes, value: bytes) -> bytes:
    out = b"\x00" + _int(len(name), 7) + name + _int(len(value), 7) + value
    if len(out) <= _FIELD_MAX:
        if len(_FIELDS) >= _FIELDS_KEPT:
            _FIELDS.clear()
        _FIELDS[(name, value)] = out
    return out


def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """HPACK block using only literal fields without indexing (no dynamic table use)."""
    known = _FIELDS.get
    return b"".join([known((name, value)) or _field(name, value) for name, value in headers])


def header_frames(stream: int, block: bytes, end_stream: bool, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """HEADERS (+ CONTINUATION) frames carrying block, written as one contiguous unit."""
    chunks = [block[i:i + max_frame] for i in range(0, len(block), max_frame)] or [b""]
    flags = END_STREAM if end_stream else 0
    out = []
    for i, chunk in enumerate(chunks):
        last = END_HEADERS if i == len(chunks) - 1 else 0
        out.append(frame(HEADERS if i == 0 else CONTINUATION, (flags if i == 0 else 0) | last, stream, chunk))
    return b"".join(out)


def goaway(last_stream: int, code: int = NO_ERROR, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, (last_stream & 0x7FFFFFFF).to_bytes(4, "big") + code.to_bytes(4, "big") + debug)


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, increment.to_bytes(4, "big"))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, code.to_bytes(4, "big"))


# -- gRPC over HTTP/2 ---------------------------------------------------------------------

_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def grpc_timeout(value: bytes) -> float | None:
    try:
        return int(value[:-1]) * _TIMEOUT_UNITS[value[-1:]]
    except (KeyError, ValueError):
        return None


def percent_encode(message: str) -> bytes:
    """grpc-message encoding: printable ASCII except '%' stays, the rest is %XX of UTF-8."""
    out = bytearray()
    for b in message.encode("utf-8"):
        if 0x20 <= b <= 0x7E and b != 0x25:
            out.append(b)
        else:
            out += b"%%%02X" % b
    return bytes(out)


def metadata_to_headers(metadata: object) -> list[tuple[bytes, bytes]]:
    """gRPC metadata (str keys; str or bytes values) as HTTP/2 header fields."""
    out = []
    for key, value in metadata or ():
        k = key.lower().encode("ascii")
        if k.endswith(b"-bin"):
            raw = value if isinstance(value, bytes) else value.encode()
            out.append((k, base64.b64encode(raw).rstrip(b"=")))
        else:
            out.append((k, value.encode() if isinstance(value, str) else value))
    return out


def headers_to_metadata(headers: list[tuple[bytes, bytes]], skip: frozenset[bytes]) -> tuple:
    md = []
    for k, v in headers:
        if k.startswith(b":") or k in skip:
            continue
        key = k.decode("ascii")
        if key.endswith("-bin"):
            md.append((key, base64.b64decode(v + b"=" * (-len(v) % 4))))
        else:
            md.append((key, v.decode("latin-1")))
    return tuple(md)


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + len(body).to_bytes(4, "big") + body
