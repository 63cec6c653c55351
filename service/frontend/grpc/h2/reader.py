"""Cutting an h2 connection's incoming bytes into frames (RFC 7540 section 4): the client preface, the 9-byte
frame heads read with struct and slices, the frame size limit, padding taken off DATA and HEADERS, header blocks
gathered from CONTINUATION frames; each frame is handed to the connection (roles.Frames)."""

from __future__ import annotations

from service.frontend.grpc.h2 import frames as f
from service.frontend.grpc.h2.roles import Frames


class FrameReader:
    def __init__(self, conn: Frames) -> None:
        self.conn = conn
        self._buf = bytearray()
        self._preface = True
        self._cont: tuple[int, int, bytearray] | None = None  # (stream, HEADERS flags, block so far)

    def feed(self, data: bytes) -> None:
        conn = self.conn
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        if self._preface:
            if end < 24:
                return
            if buf[:24] != f.PREFACE:
                conn.goaway(f.PROTOCOL_ERROR, "bad connection preface")
                return
            self._preface, pos = False, 24
        while end - pos >= 9:
            length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
            if length > f.MAX_FRAME_IN:
                conn.goaway(f.FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                return
            if end - pos < 9 + length:
                break
            ftype, flags = buf[pos + 3], buf[pos + 4]
            sid = f.U32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
            start = pos + 9
            pos = start + length
            if self._cont is not None and ftype != f.CONTINUATION:
                conn.goaway(f.PROTOCOL_ERROR, "expected CONTINUATION")
                return
            if ftype == f.DATA:
                bounds = f.payload_bounds(buf, flags, start, pos, priority=False)
                if bounds is None:
                    conn.goaway(f.PROTOCOL_ERROR, "DATA shorter than its padding")
                    return
                conn.data(sid, flags, buf, pos - start, *bounds)
            elif ftype == f.HEADERS:
                bounds = f.payload_bounds(buf, flags, start, pos, priority=True)
                if bounds is None:
                    conn.goaway(f.PROTOCOL_ERROR, "HEADERS shorter than its padding and priority")
                    return
                start, stop = bounds
                if flags & f.END_HEADERS:
                    conn.headers(sid, flags, bytes(buf[start:stop]))
                else:
                    self._cont = (sid, flags, bytearray(buf[start:stop]))
            elif ftype == f.CONTINUATION:
                if self._cont is None or self._cont[0] != sid:
                    conn.goaway(f.PROTOCOL_ERROR, "unexpected CONTINUATION")
                    return
                self._cont[2].extend(buf[start:pos])
                if flags & f.END_HEADERS:
                    csid, cflags, block = self._cont
                    self._cont = None
                    conn.headers(csid, cflags, bytes(block))
            else:
                conn.control(ftype, flags, sid, bytes(buf[start:pos]))
            if conn.stopped():
                return
        del buf[:pos]
