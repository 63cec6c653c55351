"""Protobuf's base-128 varints, read and written (compiled with mypyc): the wire-level ModelInfer messages
(wire.py) and the large-message splitter (large.py) share them."""

from __future__ import annotations

from typing import Final

ONE_BYTE: Final = [bytes((i,)) for i in range(256)]  # one-byte varints and tags, made once


def read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) from buf[pos:end]; position -1 when truncated or longer than ten bytes
    (protobuf's limit)."""
    result = 0
    shift = 0
    while pos < end and shift < 70:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
    return 0, -1


def varint_bytes(value: int) -> bytes:
    """A non-negative value as a varint."""
    if value < 0x80:
        return ONE_BYTE[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
