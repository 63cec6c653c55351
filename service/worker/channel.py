"""The worker side of the control channel (two pipes, ipc/pipes.py): framed send/recv, tensor (de)materialization
over shared memory.

Reading uses a leader/follower scheme instead of a reader thread: the main loop reads while idle; a thread
that must wait for a reply (a BLS call made from inside execute) reads the channel itself when nobody else
is. That keeps the common path free of thread hand-offs.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Callable, Sized
from concurrent.futures import Future
from typing import Any, cast

import numpy as np
from mypy_extensions import mypyc_attr

from service.ipc import frames as ipc
from service.ipc.arena import DEFAULT_GROWTH_BYTES, ArenaMap, GrowingArena
from service.ipc.pipes import ByteStream
from shm.system import SegmentTruncated, check_extent
from shm.tensor import numpy_to_datatype, numpy_to_raw, raw_to_numpy


class ClientSegments:
    """Client POSIX segments mapped by key, reused across requests, remapped when the segment changes.

    The server sends ipc.Unmap when a region is unregistered and no longer used, so a client's segment is
    not kept mapped here after the client is done with it.
    """

    def __init__(self) -> None:
        # key -> (inode, mapped length, mapping, fd kept open to fstat the segment before every access)
        self._maps: dict[str, tuple[int, int, mmap.mmap, int]] = {}
        self._lock = threading.Lock()

    def buffer(self, key: str, offset: int, nbytes: int, path: str = "") -> memoryview:
        """The whole segment `key` as a writable memoryview, checked to hold [offset, offset + nbytes) now.

        A segment is mapped once and kept until the server says it was unregistered (ipc.Unmap), as Triton keeps
        a region mapped from registration on: no mmap per request, and a segment of the same name that
        someone else creates later (POSIX names are machine-wide) is not picked up behind the client's back.
        It is remapped only when the mapping is shorter than needed (the segment grew). Its real size is
        checked (one fstat) before every use: touching a mapping past the end of a segment the client
        truncated would kill this process with SIGBUS; SegmentTruncated (a ValueError) is raised instead."""
        need = offset + nbytes
        with self._lock:
            cached = self._maps.get(key)
            if cached is not None:
                check_extent(cached[3], key, offset, nbytes)
                if cached[1] >= need:
                    return memoryview(cached[2])
        # the server's path opens the object it registered even if the client unlinked the key since
        path = path or "/dev/shm/" + key.lstrip("/")
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise ValueError(f"Unable to open shared memory region: '{key}'") from None
        try:
            st = os.fstat(fd)
            if need > st.st_size:
                raise SegmentTruncated(key, st.st_size, offset, nbytes)
            mapped = mmap.mmap(fd, st.st_size)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            cached = self._maps.pop(key, None)
            if cached is not None:
                _close_quietly(cached[2])
                os.close(cached[3])
            self._maps[key] = (st.st_ino, st.st_size, mapped, fd)
            return memoryview(mapped)

    def drop(self, keys: list[str]) -> None:
        """Forget (and unmap, unless a model still holds a view) the mappings of these keys."""
        with self._lock:
            for key in keys:
                cached = self._maps.pop(key, None)
                if cached is not None:
                    _close_quietly(cached[2])
                    os.close(cached[3])

    @property
    def keys(self) -> list[str]:
        """Keys currently mapped."""
        with self._lock:
            return list(self._maps)


def _close_quietly(mapping: mmap.mmap) -> None:
    """Unmap now, or leave it to garbage collection when numpy views of it are still alive."""
    with contextlib.suppress(BufferError):
        mapping.close()


class ClientCudaRegions:
    """Client CUDA allocations opened from their IPC handles (cupy imported on first use only)."""

    def __init__(self) -> None:
        self._regions: dict[tuple[bytes, int], Any] = {}
        self._lock = threading.Lock()

    def region(self, handle: bytes, device: int, min_size: int) -> Any:
        """The opened shm.cuda.CudaRegion for (handle, device), at least `min_size` bytes long."""
        from shm.cuda import CudaRegion

        with self._lock:
            cached = self._regions.get((handle, device))
            if cached is not None and cached.byte_size >= min_size:
                return cached
            if cached is not None:
                cached.close()
            region = CudaRegion.open(handle, min_size, device)
            self._regions[(handle, device)] = region
            return region

    def close(self) -> None:
        """Close every opened handle."""
        with self._lock:
            for region in self._regions.values():
                region.close()
            self._regions.clear()


@mypyc_attr(allow_interpreted_subclasses=True)  # InProcessChannel, when compiled with mypyc
class WorkerChannel:
    """Frames in and out of the worker, plus the arenas shared with the server."""

    def __init__(self, sock: ByteStream) -> None:
        self.sock = sock  # a PipeStream (a socket in tests and benchmarks)
        self._send_lock = threading.Lock()
        self._corked: list[Any] | None = None  # responses held back (messages, encoded at uncork)
        self._read_lock = threading.Lock()
        self._buf = bytearray(1 << 16)  # received bytes; [_pos, _end) not yet decoded
        self._view = memoryview(self._buf)  # the same bytes, made once (a new one only when the buffer grows)
        self._pos = 0
        self._end = 0
        self.in_arena: GrowingArena | None = None  # the server writes (requests, BLS replies), we read
        self.out_arena: GrowingArena | None = None  # we allocate, grow and write (responses, BLS requests)
        self.out_alloc: GrowingArena | None = None
        self._alloc_lock = threading.Lock()
        self.client_segments = ClientSegments()
        self.client_cuda = ClientCudaRegions()
        # FORCE_CPU_ONLY_INPUT_TENSORS: "no" in the model config: CUDA shm inputs stay on the GPU (cupy arrays)
        self.gpu_inputs = False
        self.pending: dict[int, Future[Any]] = {}  # replies awaited by id (BLS)
        self.on_message: Callable[[Any], None] = lambda m: None

    # ---- framing -------------------------------------------------------------------------------------
    def send(self, message: Any) -> None:
        """Send one message (thread-safe); responses are held back while corked (requests never are)."""
        with self._send_lock:
            if self._corked is not None and type(message) is ipc.Respond:
                self._corked.append(message)
                return
        frame = ipc.encode(message)
        with self._send_lock:
            self.sock.sendall(frame)

    def cork(self) -> None:
        """Hold frames back until uncork(), so a batch's responses and ExecDone leave in one write."""
        with self._send_lock:
            self._corked = []

    def uncork(self, last: Any = None) -> None:
        """Send the held responses (plus `last`, an ExecDone: inside the last response when there is one) in one
        write and stop holding."""
        with self._send_lock:
            held, self._corked = self._corked or [], None
            if last is not None:
                held = ipc.with_done(held, last)
            if len(held) == 1:
                self.sock.sendall(ipc.encode(held[0]))
            elif held:
                self.sock.sendall(b"".join([ipc.encode(m) for m in held]))

    def _fill(self, need: int) -> None:
        """Read until at least `need` unread bytes are buffered: one read takes whatever the channel holds (a
        whole frame, or several pipelined ones), so a frame costs one system call instead of two."""
        buf, pos, end = self._buf, self._pos, self._end
        if pos == end:  # everything was decoded (the common case): start over at the front, nothing to move
            self._pos = self._end = end = 0
        elif pos:  # move the unread tail to the front
            buf[: end - pos] = buf[pos:end]
            self._pos, end = 0, end - pos
            self._end = end
        if len(buf) < need:
            grown = bytearray(max(need, 2 * len(buf)))
            grown[:end] = buf[:end]
            self._buf = buf = grown
            self._view = memoryview(grown)
        view = self._view
        while end < need:
            k = self.sock.recv_into(view[end:])
            if k == 0:
                raise EOFError("server closed the control channel")
            end += k
            self._end = end

    def recv(self) -> Any:
        """Block for one message (caller holds the read lock)."""
        if self._end - self._pos < 4:
            self._fill(4)
        (n,) = ipc.HEADER.unpack_from(self._buf, self._pos)
        if self._end - self._pos < 4 + n:
            self._fill(4 + n)
        start = self._pos + 4
        self._pos = start + n
        # decoding copies what it keeps (bytes fields), so the buffer can be reused at once
        return ipc.decode(self._view[start : start + n])

    def read_one(self) -> Any:
        """Read one message as the loop's reader."""
        with self._read_lock:
            return self.recv()

    def read_one_unless(self, pending: Sized) -> Any:
        """read_one(), unless `pending` (the work queue a reader adds to) is not empty once the read lock is
        held (then None, nothing read)."""
        with self._read_lock:
            return None if pending else self.recv()

    def wait_for(self, future: Future[Any]) -> Any:
        """Block until `future` is resolved, reading and dispatching frames while nobody else reads."""
        while not future.done():
            if self._read_lock.acquire(timeout=0.001):
                try:
                    if not future.done():  # (no `break` in try/finally: mypyc cannot compile it)
                        self.on_message(self.recv())
                finally:
                    self._read_lock.release()
        return future.result()

    # ---- tensors -------------------------------------------------------------------------------------
    def map_arenas(self, in_name: str, out_name: str, growth_bytes: int = DEFAULT_GROWTH_BYTES) -> None:
        """Map the two arenas the server created (either grows by `growth_bytes` steps when full)."""
        self.in_arena = GrowingArena(ArenaMap(in_name, 0, create=False), growth_bytes)
        self.out_arena = GrowingArena(ArenaMap(out_name, 0, create=False), growth_bytes)
        self.out_alloc = self.out_arena

    def release(self, offsets: list[int]) -> None:
        """The server is done with these output-arena blocks."""
        assert self.out_alloc is not None
        with self._alloc_lock:
            for off in offsets:
                self.out_alloc.free(off)

    def tensor_to_numpy(self, t: ipc.TensorMsg) -> np.ndarray:
        """Materialize an input: a view over the arena or the client's segment (no copy) when possible."""
        if t.where == ipc.WHERE_INLINE:
            # in-process instances pass memoryviews where frames carry bytes: read untyped, or mypyc's checked
            # read of the `bytes` field would refuse them
            return raw_to_numpy(cast(Any, t).data, t.datatype, t.shape)
        if t.where == ipc.WHERE_ARENA:
            assert self.in_arena is not None
            return raw_to_numpy(self.in_arena.buffer[t.offset : t.offset + t.nbytes], t.datatype, t.shape)
        if t.where == ipc.WHERE_SYSTEM_SHM:
            buf = self.client_segments.buffer(t.key, t.offset, t.nbytes, t.path)
            return raw_to_numpy(buf[t.offset : t.offset + t.nbytes], t.datatype, t.shape)
        region = self.client_cuda.region(t.handle, t.device, t.offset + t.nbytes)
        if self.gpu_inputs and t.datatype != "BYTES":
            return region.cupy_view(t.datatype, t.shape, t.offset)  # type: ignore[no-any-return]
        return raw_to_numpy(region.read(t.offset, t.nbytes).data, t.datatype, t.shape)  # one device->host copy

    def numpy_to_tensor(self, name: str, array: np.ndarray, target: ipc.TensorMsg | None) -> ipc.TensorMsg:
        """Describe an output for the server; bytes go to the client's region, inline, or the out arena."""
        datatype = numpy_to_datatype(array.dtype)
        shape = list(array.shape)
        if target is None and datatype != "BYTES" and array.nbytes <= ipc.INLINE_LIMIT:
            # the common small output: its bytes in C order in one call (numpy_to_raw + bytes() cost several)
            return ipc.TensorMsg(name, datatype, shape, data=array.tobytes())
        raw = numpy_to_raw(array)
        nbytes = len(raw) if isinstance(raw, bytes) else raw.nbytes
        if target is not None:
            if nbytes > target.nbytes:
                raise OutputTooLarge(name, target.nbytes, nbytes)
            if target.where == ipc.WHERE_CUDA_SHM:
                region = self.client_cuda.region(target.handle, target.device, target.offset + target.nbytes)
                region.write(target.offset, raw)
                return ipc.TensorMsg(name, datatype, shape, ipc.WHERE_CUDA_SHM, nbytes=nbytes)
            buf = self.client_segments.buffer(target.key, target.offset, nbytes, target.path)
            buf[target.offset : target.offset + nbytes] = raw
            return ipc.TensorMsg(name, datatype, shape, ipc.WHERE_SYSTEM_SHM, nbytes=nbytes)
        if nbytes <= ipc.INLINE_LIMIT:
            return ipc.TensorMsg(name, datatype, shape, data=bytes(raw))
        assert self.out_alloc is not None and self.out_arena is not None
        with self._alloc_lock:
            offset = self.out_alloc.alloc(nbytes)  # grows the arena when full; ShmPoolExhausted if /dev/shm is
        self.out_arena.buffer[offset : offset + nbytes] = raw
        return ipc.TensorMsg(name, datatype, shape, ipc.WHERE_ARENA, offset=offset, nbytes=nbytes)


class OutputTooLarge(Exception):
    """An output does not fit the client's shared-memory region."""

    def __init__(self, name: str, capacity: int, needed: int) -> None:
        super().__init__(
            f"shared memory size specified with the request for output '{name}' ({capacity} bytes) "
            f"should be at least {needed} bytes to hold the results"
        )
