"""gRPC messages on a stream: cut from the request DATA by their 5-byte prefix, the length checked against the
receive limit before the body is buffered, gzip/deflate requests decompressed (bounded), responses framed and
compressed as the call says."""

from __future__ import annotations

import zlib

import grpc

from service.frontend.grpc.h2.frames import PREFIX
from service.frontend.grpc.h2.roles import Sink
from service.frontend.grpc.large import writable_bytes

_WBITS = {"gzip": 31, "deflate": 15}  # grpc's "deflate" is the zlib format
_LEVEL = 6
_EMPTY = memoryview(b"")


class Inbound:
    """Request bytes of one stream -> complete messages pushed to the call's context. A message that arrives whole
    in one DATA frame is copied out of it once; a longer one is written, as its frames come, straight into a bytes
    object of the length its prefix announced (large.writable_bytes): one copy, no growing buffer."""

    __slots__ = ("body", "ctx", "encoding", "filled", "flag", "head", "held", "limit", "need", "stopped", "view")

    def __init__(self, ctx: Sink, encoding: str, limit: int) -> None:
        self.ctx = ctx
        self.encoding = encoding
        self.limit = limit
        self.head = bytearray()  # a prefix cut by the end of a frame
        self.need = -1  # length of the message being assembled; -1 while its prefix is incomplete
        self.flag = 0  # its compressed flag
        self.body = b""  # the message being assembled (written through `view`)
        self.view = _EMPTY
        self.filled = 0
        self.held = 0  # wire bytes of complete messages its handler has not read yet
        self.stopped = False  # an error ended the input: later bytes are dropped

    def feed(self, data: memoryview) -> None:
        pos, end = 0, len(data)
        while pos < end and not self.stopped:
            if self.need < 0:
                if not self.head and end - pos >= 5:
                    flag, n = PREFIX.unpack_from(data, pos)
                    pos += 5
                else:
                    take = min(5 - len(self.head), end - pos)
                    self.head += data[pos : pos + take]
                    pos += take
                    if len(self.head) < 5:
                        return
                    flag, n = PREFIX.unpack_from(self.head)
                    self.head.clear()
                if n > self.limit:  # refused from the prefix: nothing of the body is kept
                    self._fail(
                        grpc.StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max ({n} vs. {self.limit})"
                    )
                    return
                if end - pos >= n:  # the usual case: the whole message is in this frame
                    self._complete(flag, n, bytes(data[pos : pos + n]))
                    pos += n
                    continue
                try:
                    self.body, self.view = writable_bytes(n)
                except MemoryError:
                    self._fail(grpc.StatusCode.RESOURCE_EXHAUSTED, f"No memory for a message of {n} bytes")
                    return
                self.flag, self.need, self.filled = flag, n, 0
            view = self.view
            take = min(self.need - self.filled, end - pos)
            view[self.filled : self.filled + take] = data[pos : pos + take]
            self.filled += take
            pos += take
            if self.filled == self.need:
                body, self.body, self.view = self.body, b"", _EMPTY
                view.release()
                n, self.need = self.need, -1
                self._complete(self.flag, n, body)

    def _complete(self, flag: int, n: int, message: bytes) -> None:
        self.held += 5 + n
        if flag:
            decompressed = self._decompress(message)
            if decompressed is None:
                return
            message = decompressed
        self.ctx.push(message, 5 + n)

    def _decompress(self, message: bytes) -> bytes | None:
        wbits = _WBITS.get(self.encoding)
        if wbits is None:
            self._fail(grpc.StatusCode.INTERNAL, "Compressed message received without grpc-encoding")
            return None
        try:
            d = zlib.decompressobj(wbits)
            out = d.decompress(message, self.limit + 1)
        except zlib.error:
            self._fail(grpc.StatusCode.INTERNAL, f"Unexpected error decompressing data for algorithm {self.encoding}")
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
        self.body, self.view = b"", _EMPTY
        self.ctx.fail_input(code, message)


def encode_message(message: bytes, encoding: str) -> tuple[bytes, bytes]:
    """A message's 5-byte prefix and its body, compressed with `encoding` ("" or identity: not compressed); sent
    apart, so that the body is never copied to join them."""
    wbits = _WBITS.get(encoding)
    if wbits is None:
        return PREFIX.pack(0, len(message)), message
    c = zlib.compressobj(_LEVEL, zlib.DEFLATED, wbits)
    body = c.compress(message) + c.flush()
    return PREFIX.pack(1, len(body)), body
