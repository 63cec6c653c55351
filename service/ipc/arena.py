"""A shared-memory arena between the server and one worker: POSIX segments plus first-fit allocators.

One side allocates and writes; the other side reads by (offset, nbytes) and tells the writer when it may
reuse the space. The segment name is unlinked as soon as both sides have mapped it, so nothing is left in
/dev/shm even when a process is killed.

An arena grows on demand, as Triton's Python-backend shared-memory pool does (`shm-growth-byte-size`): when a
tensor does not fit, the writer adds a segment of a multiple of the growth size (its pages reserved with
posix_fallocate, so a full /dev/shm is an error, not a SIGBUS later) named after the first one (`<name>.<k>`).
Offsets are virtual: segment k starts where segment k-1 ends. The reader maps a segment (and unlinks its name)
the first time an offset points into it. Only when /dev/shm cannot hold the new segment does an allocation fail,
with ShmPoolExhausted ("Failed to increase the shared memory pool size ...").
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import mmap
import os
import threading

import posix_ipc

ALIGN = 64
SEGMENT_PREFIX = "trireme_"
DEFAULT_GROWTH_BYTES = 64 << 20  # --backend-config=python,shm-growth-byte-size=N


class ShmPoolExhausted(Exception):
    """/dev/shm cannot hold the segment an arena needed to grow by."""


def segment_name(tag: str) -> str:
    """A POSIX shm name unique to this process; the pid lets a restarted server remove stale segments."""
    return f"/{SEGMENT_PREFIX}{os.getpid()}_{tag}"


class ArenaMap:
    """A mapped segment (either side)."""

    def __init__(self, name: str, size: int, create: bool, reserve: bool = False) -> None:
        if create and reserve:  # pages reserved now: a full /dev/shm is an error here, never a SIGBUS later
            reserved = _reserved_segment(name, size, name)
            self.size: int = reserved.size
            self.mmap: mmap.mmap = reserved.mmap
            self.name = name
            self.buffer: memoryview = reserved.buffer
            return
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


class GrowingArena:
    """An arena made of segments: segment 0 (created by the server) and segments added when a tensor does not fit.

    The writing side uses alloc/free and `buffer[a:b] = data`; the reading side uses `buffer[a:b]`. Both sides
    hold one instance per arena; segments the other side added are mapped lazily, from their derived names.
    """

    def __init__(self, first: ArenaMap, growth_bytes: int = DEFAULT_GROWTH_BYTES) -> None:
        self.name = first.name
        self.growth = max(ALIGN, growth_bytes)
        self.segments = [first]
        self.bases = [0]
        self.allocators = [Allocator(first.size)]
        self.created: list[str] = []  # names of segments this side added (unlinked by the reader or at close)
        self._lock = threading.Lock()
        self.buffer = self  # `arena.buffer[a:b]` reads/writes at virtual offsets, like ArenaMap.buffer

    @property
    def size(self) -> int:
        """Bytes over every segment mapped here."""
        return self.bases[-1] + self.segments[-1].size

    # ---- writer -----------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> int:
        """Virtual offset of a block of at least nbytes, growing the arena when no segment has room."""
        for base, allocator in zip(self.bases, self.allocators, strict=True):
            offset = allocator.alloc(nbytes)
            if offset is not None:
                return base + offset
        self._grow(nbytes)
        offset = self.allocators[-1].alloc(nbytes)
        assert offset is not None
        return self.bases[-1] + offset

    def free(self, offset: int) -> None:
        """Return a block (unknown offsets are ignored)."""
        i = bisect.bisect_right(self.bases, offset) - 1
        if i >= 0 and i < len(self.allocators):
            self.allocators[i].free(offset - self.bases[i])

    def _grow(self, nbytes: int) -> None:
        need = max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)
        size = max(1, -(-need // self.growth)) * self.growth
        name = f"{self.name}.{len(self.segments)}"
        segment = _reserved_segment(name, size, self.name)
        self.created.append(name)
        self._add(segment)

    def _add(self, segment: ArenaMap) -> None:
        self.bases.append(self.size)
        self.segments.append(segment)
        self.allocators.append(Allocator(segment.size))

    # ---- reader -----------------------------------------------------------------------------------------
    def __getitem__(self, key: slice) -> memoryview:
        segment, start, stop = self._locate(key)
        return segment.buffer[start:stop]

    def __setitem__(self, key: slice, data: bytes | bytearray | memoryview) -> None:
        segment, start, stop = self._locate(key)
        segment.buffer[start:stop] = data

    def _locate(self, key: slice) -> tuple[ArenaMap, int, int]:
        start, stop = int(key.start or 0), int(key.stop)
        if stop > self.size:
            self._map_until(stop)
        i = bisect.bisect_right(self.bases, start) - 1
        base = self.bases[i]
        segment = self.segments[i]
        if stop - base > segment.size:
            raise ValueError(f"block [{start}, {stop}) crosses the end of segment {i} of arena '{self.name}'")
        return segment, start - base, stop - base

    def _map_until(self, end: int) -> None:
        """Map the segments the other side added, until `end` is covered; their names go once mapped."""
        with self._lock:
            while end > self.size:
                segment = ArenaMap(f"{self.name}.{len(self.segments)}", 0, create=False)
                segment.unlink()  # both sides have it mapped now
                self._add(segment)

    # ---- both ---------------------------------------------------------------------------------------------
    def unlink(self) -> None:
        """Remove segment 0's name, those of segments added here that the other side never mapped, and those of
        segments the other side added that were never mapped here."""
        self.segments[0].unlink()
        for name in self.created:
            with contextlib.suppress(posix_ipc.ExistentialError):
                posix_ipc.unlink_shared_memory(name)
        k = len(self.segments)
        while True:
            try:
                posix_ipc.unlink_shared_memory(f"{self.name}.{k}")
            except posix_ipc.ExistentialError:
                return
            k += 1

    def close(self) -> None:
        """Unmap every segment."""
        for segment in self.segments:
            segment.close()


def _reserved_segment(name: str, size: int, arena: str) -> ArenaMap:
    """A new segment of `size` bytes whose pages are reserved now; ShmPoolExhausted when /dev/shm is full."""
    seg = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=0)
    try:
        try:
            os.posix_fallocate(seg.fd, 0, size)
        except OSError as e:
            with contextlib.suppress(posix_ipc.ExistentialError):
                seg.unlink()
            free = _free_shm_bytes()
            reason = "/dev/shm is full" if e.errno in (errno.ENOSPC, errno.ENOMEM) else e.strerror
            raise ShmPoolExhausted(
                f"Failed to increase the shared memory pool size for key '{arena.lstrip('/')}' by {size} bytes: "
                f"{reason} ({free} bytes free). If you are running inside docker, use '--shm-size' to give the "
                "container more shared memory"
            ) from None
        mapped = ArenaMap.__new__(ArenaMap)
        mapped.size = size
        mapped.mmap = mmap.mmap(seg.fd, size)
        mapped.name = name
        mapped.buffer = memoryview(mapped.mmap)
        return mapped
    finally:
        seg.close_fd()


def _free_shm_bytes() -> int:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize
