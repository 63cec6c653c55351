"""The server <-> worker frame channel: two pipes, one each way, in place of one Unix socket pair.

Nothing on this channel needs a socket (no descriptors are passed over it, no shutdown(), no socket options), and a
pipe's write and read cost less in the kernel than a Unix socket's send and recv: ~2.5 µs less per one-way hop when
server and worker share a CPU (docs/benchmarks.md, "Item 3"). Everything that opens the channel goes through here:
`pipe_pair()` makes both processes' ends, `PipeStream` is the worker's blocking end (the two socket calls its
channel makes), `open_pipes()` puts the server's end on its event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from typing import NamedTuple, Protocol

# Frames up to the inline limit (64 KiB of tensor bytes plus the frame) fit the pipe in one write, as they fit a
# socket's buffer (212,992 bytes by default); Linux lets anyone raise a pipe to 1 MiB (fs.pipe-max-size)
PIPE_BYTES = 256 * 1024


class ByteStream(Protocol):
    """What the worker's channel needs from its end: a socket.socket or a PipeStream."""

    def sendall(self, data: bytes, /) -> None: ...
    def recv_into(self, buffer: memoryview, /) -> int: ...


class PipeEnds(NamedTuple):
    """One process's two descriptors of the channel."""

    read_fd: int
    write_fd: int


def pipe_pair() -> tuple[PipeEnds, PipeEnds]:
    """(the server's ends, the worker's ends) of two new pipes; the descriptors are not inheritable (pass the
    worker's in `pass_fds`) and the caller closes them."""
    to_worker_r, to_worker_w = os.pipe()
    try:
        to_server_r, to_server_w = os.pipe()
    except BaseException:
        os.close(to_worker_r)
        os.close(to_worker_w)
        raise
    for fd in (to_worker_w, to_server_w):
        with contextlib.suppress(OSError):  # past the user's pipe-buffer quota: the default 64 KiB still works
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    return PipeEnds(to_server_r, to_worker_w), PipeEnds(to_worker_r, to_server_w)


def close_ends(ends: PipeEnds) -> None:
    """Close both descriptors."""
    os.close(ends.read_fd)
    os.close(ends.write_fd)


class PipeStream:
    """The worker's end, blocking: the socket calls WorkerChannel makes, on two pipe descriptors."""

    __slots__ = ("read_fd", "write_fd")

    def __init__(self, ends: PipeEnds) -> None:
        self.read_fd = ends.read_fd
        self.write_fd = ends.write_fd

    def sendall(self, data: bytes, /) -> None:
        """Write all of `data` (a blocking pipe writes it whole unless a signal cuts it short)."""
        n = os.write(self.write_fd, data)
        if n < len(data):
            view = memoryview(data)
            while n < len(data):
                n += os.write(self.write_fd, view[n:])

    def recv_into(self, buffer: memoryview, /) -> int:
        """Read what the pipe holds into `buffer` (blocks while it is empty); 0 at EOF."""
        return os.readv(self.read_fd, [buffer])

    def close(self) -> None:
        """Close both descriptors (once: a second call does nothing)."""
        fds = (self.read_fd, self.write_fd)
        self.read_fd = self.write_fd = -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)


class _PipeFile:
    """A pipe descriptor as the file object the event loop's pipe transports take.

    uvloop closes the descriptor itself when the transport closes and then calls close() here; asyncio's own loop
    leaves closing to close(). So close() closes the descriptor only while it is still this pipe: by then uvloop
    may have closed it and another thread may have opened something else under the same number."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        st = os.fstat(fd)
        self._id = (st.st_dev, st.st_ino)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            st = os.fstat(fd)
        except OSError:
            return  # already closed
        if (st.st_dev, st.st_ino) == self._id:
            os.close(fd)


class _WriteSide(asyncio.BaseProtocol):
    """The write pipe's protocol: its end is reported by the read pipe (the worker's exit closes both)."""


async def open_pipes(
    loop: asyncio.AbstractEventLoop, ends: PipeEnds, protocol: asyncio.Protocol
) -> tuple[asyncio.WriteTransport, asyncio.ReadTransport]:
    """The server's ends on `loop`: (transport to write frames to, transport that feeds `protocol` what the worker
    writes; its connection_lost() is the worker's end). Takes ownership of both descriptors."""
    read_file, write_file = _PipeFile(ends.read_fd), _PipeFile(ends.write_fd)
    try:
        reader, _ = await loop.connect_read_pipe(lambda: protocol, read_file)
    except BaseException:
        read_file.close()
        write_file.close()
        raise
    try:
        writer, _ = await loop.connect_write_pipe(_WriteSide, write_file)
    except BaseException:
        reader.close()
        write_file.close()
        raise
    return writer, reader
