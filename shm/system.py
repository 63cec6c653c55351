"""POSIX system shared-memory regions (posix_ipc + mmap) with windows at any byte offset.

Keys follow tritonclient: "/input_simple" and "input_simple" both name /dev/shm/input_simple. Nothing here
registers with multiprocessing's resource_tracker, so opening a client's segment never unlinks it at exit.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Sequence
from types import TracebackType

import numpy as np
import posix_ipc

from shm.tensor import numpy_to_raw
from shm.views import buffer_to_numpy, check_window

NAME_MAX = 255


def validate_key(key: str) -> str:
    """Check a shared-memory key and return its canonical POSIX name ("/name"); ValueError if invalid.

    Rejected: empty or all-slash keys, '/' after the leading slashes, the names '.' and '..', NUL, and
    names (leading slashes removed) longer than 255 bytes.
    """
    if not isinstance(key, str) or not key:
        raise ValueError("shared memory key must be a non-empty string")
    name = key.lstrip("/")
    if not name:
        raise ValueError(f"shared memory key '{key}' has no name after its leading slashes")
    if "/" in name:
        raise ValueError(f"shared memory key '{key}' contains '/' after its leading slashes")
    if "\0" in name:
        raise ValueError("shared memory key contains a NUL character")
    if name in (".", ".."):
        raise ValueError(f"shared memory key '{key}' is not a valid name")
    if len(name.encode("utf-8")) > NAME_MAX:
        raise ValueError(f"shared memory key is longer than {NAME_MAX} bytes")
    return "/" + name


def _open_segment(key: str, flags: int = 0, size: int = 0, read_only: bool = False) -> posix_ipc.SharedMemory:
    """shm_open through posix_ipc, with its errors turned into the matching OSError subclasses."""
    name = validate_key(key)
    try:
        return posix_ipc.SharedMemory(name, flags=flags, mode=0o600, size=size, read_only=read_only)
    except posix_ipc.ExistentialError as exc:
        if flags & posix_ipc.O_EXCL:
            raise FileExistsError(f"shared memory segment '{key}' already exists") from exc
        raise FileNotFoundError(f"shared memory segment '{key}' does not exist") from exc
    except posix_ipc.PermissionsError as exc:
        raise PermissionError(f"no permission to open shared memory segment '{key}'") from exc
    except posix_ipc.Error as exc:
        raise OSError(f"cannot open shared memory segment '{key}': {exc}") from exc


def segment_size(key: str) -> int:
    """Current size in bytes (fstat) of the segment named by `key`; FileNotFoundError if absent."""
    segment = _open_segment(key, read_only=True)
    try:
        return os.fstat(segment.fd).st_size
    finally:
        segment.close_fd()


class SegmentTruncated(ValueError):
    """A segment is now shorter than a tensor in it needs (the client truncated it after registration).

    Touching a mapping past the end of its file raises SIGBUS, which kills the process, so every read and
    write checks the segment's real size (check_extent) first."""

    def __init__(self, key: str, size: int, offset: int, nbytes: int) -> None:
        super().__init__(
            f"shared memory object '{key}' holds {size} bytes, too few for {nbytes} bytes at offset {offset}: "
            "it was truncated after registration"
        )


def check_extent(fd: int, key: str, offset: int, nbytes: int) -> None:
    """Raise SegmentTruncated unless the segment open as `fd` reaches offset + nbytes right now."""
    # The size from lseek(SEEK_END): the same i_size fstat reports, without building a stat_result (0.5 vs 1.5 µs;
    # this runs for every shm tensor on both sides). Nothing reads or writes through these descriptors (mappings
    # only), so moving their file position is harmless. fstat where a system refuses lseek on shm (ESPIPE).
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        size = os.fstat(fd).st_size
    if offset + nbytes > size:
        raise SegmentTruncated(key, size, offset, nbytes)


def unlink(key: str) -> None:
    """Remove the segment named by `key` from /dev/shm; FileNotFoundError if absent."""
    try:
        posix_ipc.unlink_shared_memory(validate_key(key))
    except posix_ipc.ExistentialError as exc:
        raise FileNotFoundError(f"shared memory segment '{key}' does not exist") from exc


class SystemRegion:
    """A mapped window [offset, offset + byte_size) of a POSIX shared-memory segment."""

    def __init__(
        self,
        key: str,
        mapping: mmap.mmap | None,
        start: int,
        offset: int,
        byte_size: int,
        owner: bool,
        writable: bool = True,
        fd: int = -1,
    ) -> None:
        """Wrap an existing mapping; use create() or open() instead of calling this directly.

        `fd` (owned by this object) is the segment, kept open to check its size before every access."""
        self._key = key
        self._fd = fd
        self._mmap = mapping
        self._offset = offset
        self._byte_size = byte_size
        self._owner = owner
        self._readonly = not writable
        if mapping is None:
            self._window: memoryview | None = memoryview(bytearray(0))
        else:
            self._window = memoryview(mapping)[start : start + byte_size]

    @classmethod
    def create(cls, key: str, byte_size: int) -> SystemRegion:
        """Create a new segment (O_CREX) of `byte_size` bytes and map all of it; this object owns it."""
        if byte_size < 0:
            raise ValueError("byte_size must be >= 0")
        segment = _open_segment(key, flags=posix_ipc.O_CREX, size=byte_size)
        try:
            mapping = mmap.mmap(segment.fd, byte_size) if byte_size else None
            fd = os.dup(segment.fd)
        except BaseException:
            segment.unlink()
            raise
        finally:
            segment.close_fd()
        return cls(key, mapping, 0, 0, byte_size, owner=True, fd=fd)

    @classmethod
    def open(cls, key: str, offset: int = 0, byte_size: int | None = None, writable: bool = True) -> SystemRegion:
        """Map `byte_size` bytes (default: to the end) of an existing segment starting at any `offset`.

        Raises FileNotFoundError / PermissionError when the segment cannot be opened, ValueError when the
        key is invalid or the window lies outside the segment, and OSError when mmap fails.
        """
        segment = _open_segment(key, read_only=not writable)
        try:
            size = os.fstat(segment.fd).st_size
            if byte_size is None:
                byte_size = size - offset
            check_window(offset, byte_size, size)
            mapping = None
            floor = offset - offset % mmap.ALLOCATIONGRANULARITY
            if byte_size:
                prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
                length = offset + byte_size - floor
                mapping = mmap.mmap(segment.fd, length, flags=mmap.MAP_SHARED, prot=prot, offset=floor)
            fd = os.dup(segment.fd)
        finally:
            segment.close_fd()
        return cls(key, mapping, offset - floor, offset, byte_size, owner=False, writable=writable, fd=fd)

    @property
    def key(self) -> str:
        """The key this region was created or opened with."""
        return self._key

    @property
    def fd_path(self) -> str:
        """A path that opens this very segment from any process of this user while the region is open (the
        descriptor it keeps, through /proc), even after its key was unlinked; "" when it keeps none."""
        return f"/proc/{os.getpid()}/fd/{self._fd}" if self._fd >= 0 else ""

    @property
    def offset(self) -> int:
        """Offset of this window inside the segment."""
        return self._offset

    @property
    def byte_size(self) -> int:
        """Size of the mapped window in bytes."""
        return self._byte_size

    @property
    def closed(self) -> bool:
        """Whether close() has been called."""
        return self._window is None

    @property
    def buffer(self) -> memoryview:
        """The whole window as a memoryview (read-only when opened with writable=False)."""
        if self._window is None:
            raise ValueError(f"shared memory region '{self._key}' is closed")
        return self._window.toreadonly() if self._readonly else self._window

    def check(self, offset: int, nbytes: int) -> None:
        """Raise ValueError unless [offset, offset + nbytes) of the window lies inside it and inside the segment
        as it is now (SegmentTruncated when the segment was truncated after it was mapped)."""
        check_window(offset, nbytes, self._byte_size)
        if nbytes and self._fd >= 0:
            check_extent(self._fd, self._key, self._offset + offset, nbytes)

    def check_segment(self, offset: int, nbytes: int) -> None:
        """The segment half of check() alone (SegmentTruncated), for a caller that has checked [offset, offset +
        nbytes) against byte_size itself (the registry, per tensor per request)."""
        if nbytes and self._fd >= 0:
            check_extent(self._fd, self._key, self._offset + offset, nbytes)

    def view(self, offset: int, nbytes: int) -> memoryview:
        """Zero-copy memoryview of `nbytes` bytes at `offset` inside the window (size checked first)."""
        self.check(offset, nbytes)
        return self.buffer[offset : offset + nbytes]

    def ndarray(self, datatype: str, shape: Sequence[int], offset: int = 0) -> np.ndarray:
        """Numpy array at `offset`: a zero-copy view for fixed types, a decoded object array for BYTES."""
        return buffer_to_numpy(self.view(0, self._byte_size), datatype, shape, offset)

    def write(self, offset: int, data: bytes | bytearray | memoryview | np.ndarray) -> int:
        """Copy raw bytes, or an array in wire layout (BYTES serialized), to `offset`; returns the size."""
        raw = numpy_to_raw(data) if isinstance(data, np.ndarray) else data
        src = memoryview(raw).cast("B")
        self.view(offset, len(src))[:] = src
        return len(src)

    def close(self) -> bool:
        """Unmap the window; returns False when views are still alive and the munmap was deferred.

        A numpy array or memoryview obtained from this region keeps the mapping alive; in that case the
        mmap is left to be unmapped by garbage collection once the last such view is gone. Never raises.
        """
        window, mapping = self._window, self._mmap
        self._window, self._mmap = None, None
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        if window is not None:
            with contextlib.suppress(BufferError):
                window.release()
        if mapping is None:
            return True
        try:
            mapping.close()
        except BufferError:
            return False
        return True

    def unlink(self) -> None:
        """Remove the segment from /dev/shm (mappings stay valid until closed)."""
        unlink(self._key)

    def destroy(self) -> None:
        """Close, and unlink the segment if this object created it."""
        self.close()
        if self._owner:
            self._owner = False
            with contextlib.suppress(FileNotFoundError):
                self.unlink()

    def __enter__(self) -> SystemRegion:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"SystemRegion(key={self._key!r}, offset={self._offset}, byte_size={self._byte_size}, {state})"
