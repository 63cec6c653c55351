"""gRPC messages on a stream: cut from the request DATA by their 5-byte prefix, the length checked against the
receive limit before the body is buffered, gzip/deflate requests decompressed (bounded), responses framed and
compressed as the call says."""

from __future__ import annotations

import zlib

import grpc

from service.frontend.grpc.h2.frames import PREFIX
from service.frontend.grpc.h2.roles import Sink

_WBITS = {"gzip": 31, "deflate": 15}  # grpc's "deflate" is the zlib format
_LEVEL = 6


class Inbound:
    """Request bytes of one stream -> complete messages pushed to the call's context."""

    __slots__ = ("buf", "ctx", "encoding", "held", "limit", "need", "stopped")

    def __init__(self, ctx: Sink, encoding: str, limit: int) -> None:
        self.ctx = ctx
        self.encoding = encoding
        self.limit = limit
        self.buf = bytearray()
        self.need = -1  # length of the message being assembled; -1 while its prefix is incomplete
        self.held = 0  # wire bytes of complete messages its handler has not read yet
        self.stopped = False  # an error ended the input: later bytes are dropped

    def feed(self, data: bytearray | memoryview) -> None:
        if self.stopped:
            return
        buf = self.buf
        buf += data
        while True:
            if self.need < 0:
                if len(buf) < 5:
                    return
                flag, n = PREFIX.unpack_from(buf)
                if n > self.limit:  # refused from the prefix: nothing of the body is kept
                    self._fail(
                        grpc.StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max ({n} vs. {self.limit})"
                    )
                    return
                self.need = n
            if len(buf) < 5 + self.need:
                return
            flag = buf[0]
            if len(buf) == 5 + self.need:  # the usual case: the buffer holds exactly this message
                message = bytes(memoryview(buf)[5:])
                buf.clear()
            else:
                message = bytes(memoryview(buf)[5 : 5 + self.need])
                del buf[: 5 + self.need]
            self.held += 5 + self.need
            self.need = -1
            if flag:
                message = self._decompress(message)  # type: ignore[assignment]
                if self.stopped:
                    return
            self.ctx.push(message)

    def _decompress(self, message: bytes) -> bytes | None:
        wbits = _WBITS.get(self.encoding)
        if wbits is None:
            self._fail(grpc.StatusCode.INTERNAL, "Compressed message received without grpc-encoding")
            return None
        try:
            d = zlib.decompressobj(wbits)
            out = d.decompress(message, self.limit + 1)
        except zlib.error as e:
            self._fail(grpc.StatusCode.INTERNAL, f"Unexpected error decompressing data for algorithm {self.encoding}")
            del e
            return None
        if len(out) > self.limit:
            self._fail(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({len(out)}+ vs. {self.limit})",
            )
            return None
        return out

    def _fail(self, code: grpc.StatusCode, message: str) -> None:
        self.stopped = True
        self.buf = bytearray()
        self.ctx.fail_input(code, message)


def encode_message(message: bytes, encoding: str) -> bytes:
    """A length-prefixed message, compressed with `encoding` ("" or identity: not compressed)."""
    wbits = _WBITS.get(encoding)
    if wbits is None:
        return PREFIX.pack(0, len(message)) + message
    c = zlib.compressobj(_LEVEL, zlib.DEFLATED, wbits)
    body = c.compress(message) + c.flush()
    return PREFIX.pack(1, len(body)) + body
