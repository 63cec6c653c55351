"""HTTP/2 frame and HPACK pieces the h2 transport writes (RFC 7540, RFC 7541), and gRPC's wire conventions:
the message length prefix, grpc-timeout, grpc-message percent-encoding, -bin metadata in base64."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable
from typing import Any, Final

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Final: compiled with mypyc, these are constants in the C code, not module attribute lookups
# frame types
DATA: Final = 0
HEADERS: Final = 1
PRIORITY: Final = 2
RST_STREAM: Final = 3
SETTINGS: Final = 4
PUSH_PROMISE: Final = 5
PING: Final = 6
GOAWAY: Final = 7
WINDOW_UPDATE: Final = 8
CONTINUATION: Final = 9
# flags
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20
# settings
S_HEADER_TABLE: Final = 1
S_ENABLE_PUSH: Final = 2
S_MAX_STREAMS: Final = 3
S_INITIAL_WINDOW: Final = 4
S_MAX_FRAME: Final = 5
# error codes
NO_ERROR: Final = 0
PROTOCOL_ERROR: Final = 1
INTERNAL_ERROR: Final = 2
FLOW_CONTROL_ERROR: Final = 3
FRAME_SIZE_ERROR: Final = 6
REFUSED_STREAM: Final = 7
CANCEL: Final = 8
COMPRESSION_ERROR: Final = 9
ENHANCE_YOUR_CALM: Final = 11
# SETTINGS_MAX_FRAME_SIZE announced for what we receive: grpc core's servers (grpcio, Triton) announce 4 MiB, so a
# large request comes in a few large DATA frames, not thousands of 16 KiB ones (DATA is not buffered: reader.py)
MAX_FRAME_IN: Final = 4 << 20

U32 = struct.Struct(">I")
SETTING = struct.Struct(">HI")
GOAWAY_HEAD = struct.Struct(">II")
PREFIX = struct.Struct(">BI")  # gRPC message prefix: compressed flag, length
_HEAD = struct.Struct(">HBBBI")  # length (24 bits: high 16 + low 8), type, flags, stream id


def payload_bounds(buf: memoryview, flags: int, start: int, end: int, priority: bool) -> tuple[int, int] | None:
    """Where a DATA or HEADERS frame's content lies once its pad length (PADDED), its priority fields (HEADERS with
    PRIORITY) and its padding are taken off; None when the frame is too short to hold them (PROTOCOL_ERROR)."""
    if flags & PADDED:
        if end <= start:
            return None
        pad = buf[start]
        start += 1
    else:
        pad = 0
    if priority and flags & PRIORITY_FLAG:
        start += 5
    stop = end - pad
    return (start, stop) if start <= stop else None


def head(ftype: int, flags: int, sid: int, n: int) -> bytes:
    """A frame's 9-byte head, for a payload of n bytes written after it."""
    return _HEAD.pack(n >> 8, n & 0xFF, ftype, flags, sid)


def frame(ftype: int, flags: int, sid: int, payload: bytes | bytearray | memoryview = b"") -> bytes:
    n = len(payload)
    return _HEAD.pack(n >> 8, n & 0xFF, ftype, flags, sid) + payload


def headers_frames(sid: int, flags: int, block: bytes, max_frame: int) -> bytes:
    """A header block as HEADERS (+ CONTINUATION frames when it exceeds the peer's SETTINGS_MAX_FRAME_SIZE)."""
    if len(block) <= max_frame:
        return frame(HEADERS, flags | END_HEADERS, sid, block)
    parts = [block[i : i + max_frame] for i in range(0, len(block), max_frame)]
    out = [frame(HEADERS, flags & END_STREAM, sid, parts[0])]
    out += [frame(CONTINUATION, 0, sid, p) for p in parts[1:-1]]
    out.append(frame(CONTINUATION, END_HEADERS, sid, parts[-1]))
    return b"".join(out)


# ---- HPACK encoding: literals "without indexing" only, so a block means the same on every connection ----------
def hpack_int(value: int, bits: int, first: int) -> bytes:
    """An HPACK integer with an N-bit prefix (RFC 7541 section 5.1)."""
    limit = (1 << bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def literal(name: bytes | int, value: bytes) -> bytes:
    """A header field without indexing: a static-table name index or a literal name."""
    head = hpack_int(name, 4, 0) if isinstance(name, int) else b"\x00" + hpack_int(len(name), 7, 0) + name
    return head + hpack_int(len(value), 7, 0) + value


STATUS_200 = b"\x88"  # static entry 8, ":status: 200"
CONTENT_TYPE = literal(31, b"application/grpc")  # static name 31: content-type


def response_headers(encoding: str) -> bytes:
    """The response HEADERS block: :status, content-type, and grpc-encoding when messages are compressed."""
    block = STATUS_200 + CONTENT_TYPE + literal(b"grpc-accept-encoding", b"identity,deflate,gzip")
    return block + (literal(b"grpc-encoding", encoding.encode()) if encoding != "identity" else b"")


RESPONSE_HEADERS = response_headers("identity")
HEADERS_BY_ENCODING = {e: response_headers(e) for e in ("identity", "gzip", "deflate")}
OK_TRAILERS = literal(b"grpc-status", b"0")


def metadata_block(metadata: Iterable[tuple[str, Any]]) -> bytes:
    """Custom metadata: lower-case keys, -bin values base64 without padding (as grpc core sends them)."""
    out = bytearray()
    for key, value in metadata:
        name = key.lower().encode()
        if name.endswith(b"-bin"):
            raw = value if isinstance(value, bytes | bytearray) else str(value).encode()
            data = base64.b64encode(bytes(raw)).rstrip(b"=")
        else:
            data = value.encode() if isinstance(value, str) else bytes(value)
        out += literal(name, data)
    return bytes(out)


def status_block(code: int, message: str) -> bytes:
    """grpc-status and grpc-message (percent-encoded) of a non-OK status."""
    block = literal(b"grpc-status", str(code).encode())
    return block + (literal(b"grpc-message", percent(message)) if message else b"")


def percent(message: str) -> bytes:
    """grpc-message's percent-encoding (printable ASCII except '%' stays as is)."""
    raw = message.encode("utf-8")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def decode_bin(value: bytes) -> bytes:
    """A -bin metadata value: base64 with or without padding."""
    return base64.b64decode(value + b"=" * (-len(value) % 4))


_TIMEOUT_UNIT = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout ("<digits><unit>") in seconds; None when malformed."""
    unit = _TIMEOUT_UNIT.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * unit
