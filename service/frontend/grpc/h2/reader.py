"""Cutting an h2 connection's incoming bytes into frames (RFC 7540 section 4): the client preface, the 9-byte
frame heads read with struct and indexes, the frame size limit, padding taken off DATA and HEADERS, header blocks
gathered from CONTINUATION frames; each frame is handed to the connection (roles.Frames).

Frames are read where the socket's bytes lie, by offset (no connection buffer they are first copied into): only
a frame cut by the end of a read is kept (`_cut`) until its end comes. A DATA frame without padding is not
waited for: its content goes to its stream as it arrives (large messages come as many 16 KiB frames, cut
anywhere by the reads)."""

from __future__ import annotations

from service.frontend.grpc.h2 import frames as f
from service.frontend.grpc.h2.roles import Frames


class FrameReader:
    def __init__(self, conn: Frames) -> None:
        self.conn = conn
        self._cut = bytearray()  # the start of a frame (or of the preface) the last read ended in
        self._preface = True
        self._cont: tuple[int, int, bytearray] | None = None  # (stream, HEADERS flags, block so far)
        self._rest = 0  # content bytes still to come of the DATA frame being streamed
        self._rest_sid = 0
        self._rest_flags = 0

    def feed(self, chunk: bytes) -> None:
        data = memoryview(chunk)
        pos, end = 0, len(data)
        if self._preface:
            pos = min(24 - len(self._cut), end)
            self._cut += data[:pos]
            if len(self._cut) < 24:
                return
            if self._cut != f.PREFACE:
                self.conn.goaway(f.PROTOCOL_ERROR, "bad connection preface")
                return
            self._preface = False
            self._cut.clear()
        while pos < end:
            if self._rest:
                pos = self._stream(data, pos, end)
            elif self._cut:
                pos = self._complete(data, pos, end)
            else:
                pos = self._frames(data, pos, end)
            if pos < 0 or self.conn.stopped():
                return

    def _stream(self, data: memoryview, pos: int, end: int) -> int:
        """More content of the DATA frame being streamed."""
        n = min(self._rest, end - pos)
        self._rest -= n
        flags = self._rest_flags if not self._rest else self._rest_flags & ~f.END_STREAM
        self.conn.data(self._rest_sid, flags, data, 0, pos, pos + n)  # its length counted with its head
        return pos + n

    def _complete(self, data: memoryview, pos: int, end: int) -> int:
        """Bytes towards the frame the last read cut: its head first, then (unless it is streamed) its payload."""
        cut = self._cut
        want = 9 if len(cut) < 9 else 9 + (cut[0] << 16 | cut[1] << 8 | cut[2])
        take = min(want - len(cut), end - pos)
        cut += data[pos : pos + take]
        pos += take
        if len(cut) < want:
            return pos
        if want == 9:  # the head is complete: the payload may be streamed, else wait for it
            length = cut[0] << 16 | cut[1] << 8 | cut[2]
            if length > f.MAX_FRAME_IN:
                self.conn.goaway(f.FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                return -1
            if not self._streamable(cut[3], cut[4], length) and length:
                return pos
        self._cut = bytearray()
        return pos if self._frames(memoryview(cut), 0, len(cut)) >= 0 else -1

    def _streamable(self, ftype: int, flags: int, length: int) -> bool:
        return ftype == f.DATA and not flags & f.PADDED and length > 0 and self._cont is None

    def _frames(self, buf: memoryview, pos: int, end: int) -> int:
        """The frames in buf[pos:end]; a frame cut by `end` is kept in _cut, or streamed when it is DATA. Returns
        where reading goes on, -1 once the connection is closing."""
        conn = self.conn
        while end - pos >= 9:
            length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
            if length > f.MAX_FRAME_IN:
                conn.goaway(f.FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                return -1
            ftype, flags = buf[pos + 3], buf[pos + 4]
            start = pos + 9
            if end - start < length:
                if not self._streamable(ftype, flags, length):
                    break
                sid = f.U32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
                self._rest, self._rest_sid, self._rest_flags = length - (end - start), sid, flags
                conn.data(sid, flags & ~f.END_STREAM, buf, length, start, end)  # the whole frame counted now
                return end
            sid = f.U32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
            pos = start + length
            if not self._frame(buf, ftype, flags, sid, start, pos) or conn.stopped():
                return -1
        if pos < end:
            self._cut += buf[pos:end]
        return end

    def _frame(self, buf: memoryview, ftype: int, flags: int, sid: int, start: int, stop: int) -> bool:
        """One whole frame (payload buf[start:stop]); False after a connection error."""
        conn = self.conn
        if self._cont is not None and ftype != f.CONTINUATION:
            conn.goaway(f.PROTOCOL_ERROR, "expected CONTINUATION")
            return False
        if ftype == f.DATA:
            bounds = f.payload_bounds(buf, flags, start, stop, priority=False)
            if bounds is None:
                conn.goaway(f.PROTOCOL_ERROR, "DATA shorter than its padding")
                return False
            conn.data(sid, flags, buf, stop - start, bounds[0], bounds[1])
        elif ftype == f.HEADERS:
            bounds = f.payload_bounds(buf, flags, start, stop, priority=True)
            if bounds is None:
                conn.goaway(f.PROTOCOL_ERROR, "HEADERS shorter than its padding and priority")
                return False
            if flags & f.END_HEADERS:
                conn.headers(sid, flags, bytes(buf[bounds[0] : bounds[1]]))
            else:
                self._cont = (sid, flags, bytearray(buf[bounds[0] : bounds[1]]))
        elif ftype == f.CONTINUATION:
            if self._cont is None or self._cont[0] != sid:
                conn.goaway(f.PROTOCOL_ERROR, "unexpected CONTINUATION")
                return False
            self._cont[2].extend(buf[start:stop])
            if flags & f.END_HEADERS:
                csid, cflags, block = self._cont
                self._cont = None
                conn.headers(csid, cflags, bytes(block))
        else:
            conn.control(ftype, flags, sid, bytes(buf[start:stop]))
        return True
