"""Reading protobuf messages that may not be well formed.

Python's protobuf refuses a whole message when one `string` field holds bytes that are
not UTF-8, and grpc.aio then hands the caller `None` instead of a reply. Go peers
(containerd) do not always check, so a runtime can return such messages. `parse`
replaces the bad bytes (U+FFFD) in a copy of the wire data, guided by the message
descriptor, and parses that; `invalid_strings` names the fields that were bad.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

M = TypeVar("M", bound=Message)

_MAX_DEPTH = 64  # as protobuf's own parser: deeper nesting is refused


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DecodeError("truncated or overlong varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _put_varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def _repair(desc: Descriptor | None, data: bytes, path: str, bad: list[str], depth: int = 0) -> bytes:
    """data with every invalid UTF-8 string field of desc made valid; bad gets their paths."""
    if depth > _MAX_DEPTH:
        raise DecodeError("message nested too deeply")
    out = bytearray()
    pos, n = 0, len(data)
    counts: dict[int, int] = {}
    while pos < n:
        start = pos
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            after_key = pos
            length, body = _varint(data, pos)
            pos = body + length
            if pos > n:
                raise DecodeError("truncated length-delimited field")
            field = desc.fields_by_number.get(number) if desc is not None else None
            if field is not None and field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE):
                where = f"{path}.{field.name}" if path else field.name
                if field.is_repeated:
                    i = counts[number] = counts.get(number, -1) + 1
                    where += f"[{i}]"
                payload = data[body:pos]
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    fixed = _repair(field.message_type, payload, where, bad, depth + 1)
                else:
                    try:
                        payload.decode("utf-8")
                        fixed = payload
                    except UnicodeDecodeError:
                        fixed = payload.decode("utf-8", "replace").encode("utf-8")
                        bad.append(where)
                if fixed is not payload:
                    out += data[start:after_key]
                    _put_varint(out, len(fixed))
                    out += fixed
                    continue
        else:
            raise DecodeError(f"unsupported wire type {wire}")
        if pos > n:
            raise DecodeError("truncated field")
        out += data[start:pos]
    return bytes(out)


def invalid_strings(cls: type[Message], data: bytes) -> list[str]:
    """Paths of the string fields in data that are not UTF-8 (DecodeError if it is not protobuf)."""
    bad: list[str] = []
    _repair(cls.DESCRIPTOR, bytes(data), "", bad)
    return bad


def parse(cls: type[M], data: bytes) -> tuple[M, list[str]]:
    """The message, and the paths of string fields whose invalid bytes were replaced.

    DecodeError when data is not a protobuf message of any shape.
    """
    try:
        return cls.FromString(data), []
    except DecodeError:
        pass
    bad: list[str] = []
    fixed = _repair(cls.DESCRIPTOR, bytes(data), "", bad)
    return cls.FromString(fixed), bad
