"""The reading side of a frame channel: splits a byte stream of length-prefixed frames (`frames.HEADER`, then the
payload) into messages and hands each on as it is decoded. Server side of the worker channels (msgspec payloads) and
both ends of the front-end links (pickle payloads) read through it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.ipc.frames import HEADER


class FrameReader:
    """Feed it each read; it calls `deliver(decode(payload))` for every whole frame and keeps the rest."""

    __slots__ = ("buf", "decode", "deliver")

    def __init__(self, decode: Callable[[memoryview], Any], deliver: Callable[[Any], None]) -> None:
        self.buf = bytearray()
        self.decode = decode
        self.deliver = deliver

    def feed(self, data: bytes) -> None:
        buf, decode, deliver = self.buf, self.decode, self.deliver
        if not buf:  # the common case: whole frames in one read, decoded from `data` without copying it first
            view = memoryview(data)
            pos, end = 0, len(data)
            try:
                while end - pos >= 4:
                    (n,) = HEADER.unpack_from(data, pos)
                    if end - pos - 4 < n:
                        break
                    message = decode(view[pos + 4 : pos + 4 + n])
                    pos += 4 + n
                    deliver(message)
            finally:  # also when deliver raised: the stream stays in step
                if pos < end:
                    buf += view[pos:]
            return
        buf += data
        pos, end = 0, len(buf)
        try:
            while end - pos >= 4:
                (n,) = HEADER.unpack_from(buf, pos)
                if end - pos - 4 < n:
                    break
                message = decode(memoryview(buf)[pos + 4 : pos + 4 + n])
                pos += 4 + n
                deliver(message)
        finally:
            if pos:
                del buf[:pos]
