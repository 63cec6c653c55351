"""A shared-memory arena between the server and one worker: a POSIX segment plus a first-fit allocator.

One side allocates and writes; the other side reads by (offset, nbytes) and tells the writer when it may
reuse the space. The segment name is unlinked as soon as both sides have mapped it, so nothing is left in
/dev/shm even when a process is killed.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os

import posix_ipc

ALIGN = 64
SEGMENT_PREFIX = "trireme_"


def segment_name(tag: str) -> str:
    """A POSIX shm name unique to this process; the pid lets a restarted server remove stale segments."""
    return f"/{SEGMENT_PREFIX}{os.getpid()}_{tag}"


class ArenaMap:
    """A mapped segment (either side)."""

    def __init__(self, name: str, size: int, create: bool) -> None:
        flags = posix_ipc.O_CREX if create else 0
        seg = posix_ipc.SharedMemory(name, flags, size=size if create else 0)
        try:
            self.size = seg.size
            self.mmap = mmap.mmap(seg.fd, self.size)
        finally:
            seg.close_fd()
        self.name = name
        self.buffer = memoryview(self.mmap)

    def unlink(self) -> None:
        """Remove the name from /dev/shm (the memory lives while mapped)."""
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(self.name)

    def close(self) -> None:
        """Unmap; a view still held elsewhere keeps the mapping alive until it is dropped."""
        self.buffer.release()
        # numpy views over the arena may still be alive: then the mapping goes with them
        with contextlib.suppress(BufferError):
            self.mmap.close()


class Allocator:
    """First-fit allocator over [0, size) with coalescing free blocks; offsets aligned to ALIGN."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free_starts: list[int] = [0]
        self._free_sizes: dict[int, int] = {0: size}
        self._used: dict[int, int] = {}

    def alloc(self, nbytes: int) -> int | None:
        """Offset of a block of at least nbytes, or None when no block is large enough."""
        need = max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)
        for i, start in enumerate(self._free_starts):
            block = self._free_sizes[start]
            if block >= need:
                del self._free_sizes[start]
                del self._free_starts[i]
                if block > need:
                    rest = start + need
                    self._free_sizes[rest] = block - need
                    self._free_starts.insert(i, rest)
                self._used[start] = need
                return start
        return None

    def free(self, offset: int) -> None:
        """Return a block; unknown offsets are ignored (a double free must not corrupt the arena)."""
        size = self._used.pop(offset, None)
        if size is None:
            return
        i = bisect.bisect_left(self._free_starts, offset)
        # merge with the next block
        if i < len(self._free_starts) and self._free_starts[i] == offset + size:
            nxt = self._free_starts.pop(i)
            size += self._free_sizes.pop(nxt)
        # merge with the previous block
        if i > 0:
            prev = self._free_starts[i - 1]
            if prev + self._free_sizes[prev] == offset:
                self._free_sizes[prev] += size
                return
        self._free_starts.insert(i, offset)
        self._free_sizes[offset] = size
