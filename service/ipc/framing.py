"""Frame sockets: FrameReader splits a byte stream of length-prefixed frames (`frames.HEADER`, then the payload)
into messages and hands each on as it is decoded; the server side of the worker sockets (msgspec payloads) and
both ends of the front-end links (pickle payloads) read through it. BatchedWriter sends the frames written during
one event-loop iteration in one system call (the front-end links write through it)."""

from __future__ import annotations

import asyncio
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


class BatchedWriter:
    """Frames written to a transport in one event-loop iteration leave together at its end, in one writev: with
    many requests in flight a front-end link carries several frames per iteration, and each write is a system
    call on both sides (the reader then also gets them in one read)."""

    __slots__ = ("_loop", "_out", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._out: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        out = self._out
        if not out:
            self._loop.call_soon(self._flush)
        out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, []
        t = self.transport
        if t.is_closing():  # the other side is gone: so is whoever waited for these frames
            return
        if len(out) == 1:
            t.write(out[0])
        else:
            t.writelines(out)
