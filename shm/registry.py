"""Server-side registry of client shared-memory regions (Triton's SharedMemoryManager semantics).

Region names share one namespace for system and CUDA regions. Each registered system region keeps an mmap of
its registered window; a tensor reference is resolved to a `ResolvedRegion` that carries everything a worker
process needs to map the same bytes itself. Unregistering a region that an in-flight request holds (see
`acquire`/`release`/`use`) removes it from status at once and closes its mapping after the last release.
The registry never unlinks a client's segment.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np

from shm.cuda import CUDA_IPC_HANDLE_SIZE, CudaRegion, CudaUnavailableError, require_cuda
from shm.errors import ShmError
from shm.regions import CudaRegionInfo, ResolvedRegion, SystemRegionInfo
from shm.system import SegmentTruncated, SystemRegion, validate_key
from shm.tensor import numpy_to_raw
from shm.views import buffer_to_numpy

RESERVED_KEY_PREFIX = "triton_python_backend_shm_region_"
_WINDOWS_MAX = 1024  # resolved tensor windows kept per region; past it the region's cache starts over

__all__ = ["CudaRegionInfo", "DeviceRegion", "ResolvedRegion", "SharedMemoryRegistry", "SystemRegionInfo"]


class DeviceRegion(Protocol):
    """What the registry needs from an opened CUDA region (shm.cuda.CudaRegion implements it)."""

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        """Host copy (uint8) of `nbytes` bytes at `offset`."""
        ...

    def write(self, offset: int, data: bytes | bytearray | memoryview | np.ndarray) -> int:
        """Copy host bytes to `offset`; returns the size."""
        ...

    def close(self) -> None:
        """Release the mapping."""
        ...


CudaOpener = Callable[[bytes, int, int], DeviceRegion]


def open_cuda_region(raw_handle: bytes, byte_size: int, device_id: int) -> DeviceRegion:
    """Default CUDA opener: shm.cuda.CudaRegion.open (cupy IPC)."""
    return CudaRegion.open(raw_handle, byte_size, device_id)


def _truncated(name: str, e: SegmentTruncated) -> ShmError:
    """INVALID_ARG for a region whose segment the client truncated after registering it."""
    return ShmError("INVALID_ARG", f"Invalid shared memory region: '{name}': {e}")


class _Entry:
    """One registration: its public description, its mapping and its in-flight reference count."""

    __slots__ = ("awaiting", "device", "refs", "registered", "resolved", "system", "windows")

    def __init__(self, resolved: ResolvedRegion, system: SystemRegion | None, device: DeviceRegion | None) -> None:
        self.resolved = resolved  # the whole registered window
        self.system = system
        self.device = device
        self.refs = 0
        self.registered = True
        self.awaiting = False  # unregistered while in use: goes when its last in-flight request releases it
        # (offset, byte_size) -> its ResolvedRegion, made once: clients name the same tensors request after
        # request, and a frozen ResolvedRegion costs ~1.5 µs to build
        self.windows: dict[tuple[int, int], ResolvedRegion] = {}

    def close(self) -> None:
        if self.system is not None:
            self.system.close()
        if self.device is not None:
            self.device.close()


class SharedMemoryRegistry:
    """Registered system and CUDA regions of one server; thread-safe."""

    def __init__(
        self, cuda_opener: CudaOpener | None = None, on_retire: Callable[[ResolvedRegion, bool], None] | None = None
    ) -> None:
        """`cuda_opener(raw_handle, byte_size, device_id)` opens CUDA regions (default: cupy IPC).

        With the default opener, CUDA registration answers UNAVAILABLE on hosts without cupy or a GPU.
        `on_retire(region, last_user_of_key)` is called (under no lock) when a region's mapping is closed, i.e.
        after it was unregistered and its last in-flight reference was released; `last_user_of_key` is True
        when no other live registration maps the same POSIX key or CUDA handle, so processes that mapped
        it on their own (workers) may drop their mappings too.
        """
        self.on_retire = on_retire
        self._cuda_opener = cuda_opener or open_cuda_region
        self._gpu_check: Callable[[], object] = require_cuda if cuda_opener is None else lambda: None
        self._lock = threading.Lock()
        self._by_name: dict[str, _Entry] = {}
        self._by_id: dict[int, _Entry] = {}  # registered, or unregistered but still referenced
        self._ids = itertools.count(1)

    # ---- registration -------------------------------------------------------------------------------

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map `byte_size` bytes at `offset` of the POSIX segment `key` under region `name`."""
        try:
            validate_key(key)
        except ValueError:
            raise ShmError(
                "INVALID_ARG", f"cannot register shared memory region '{name}' - invalid shm key '{key}'"
            ) from None
        if key.lstrip("/").startswith(RESERVED_KEY_PREFIX):
            raise ShmError(
                "INVALID_ARG",
                f"cannot register shared memory region '{name}' with key '{key}' as the key contains "
                f"the reserved prefix '{RESERVED_KEY_PREFIX}'",
            )
        invalid_args = ShmError("INVALID_ARG", f"failed to register shared memory region '{name}': invalid args")
        if offset < 0 or byte_size < 0:
            raise invalid_args
        with self._lock:
            if name in self._by_name:
                raise ShmError("ALREADY_EXISTS", f"shared memory region '{name}' already in manager")
            try:
                region = SystemRegion.open(key, offset, byte_size)
            except ValueError:
                raise invalid_args from None
            except (FileNotFoundError, PermissionError):
                raise ShmError("INTERNAL", f"Unable to open shared memory region: '{key}'") from None
            except OSError as exc:
                raise ShmError(
                    "INVALID_ARG",
                    f"failed to register shared memory region '{name}': unable to process address space"
                    f"{exc.strerror or exc}",
                ) from None
            region_id = next(self._ids)
            resolved = ResolvedRegion(name, "system", key, offset, byte_size, -1, b"", region_id, region.fd_path)
            self._add(_Entry(resolved, region, None))

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Open a client's CUDA allocation from its 64-byte IPC handle under region `name`."""
        # Without a GPU no handle can be opened: Triton (built with GPU support) then answers "invalid args"
        no_gpu = ShmError("INVALID_ARG", "failed to register shared memory region: invalid args")
        try:
            self._gpu_check()
        except CudaUnavailableError:
            raise no_gpu from None
        with self._lock:
            if name in self._by_name:
                raise ShmError("ALREADY_EXISTS", f"shared memory region '{name}' already in manager")
            if len(raw_handle) != CUDA_IPC_HANDLE_SIZE or device_id < 0 or byte_size < 0:
                raise ShmError("INVALID_ARG", "failed to register shared memory region: invalid args")
            try:
                device = self._cuda_opener(bytes(raw_handle), byte_size, device_id)
            except CudaUnavailableError:
                raise no_gpu from None
            except ValueError:
                raise ShmError(
                    "INVALID_ARG", f"failed to register shared memory region '{name}': invalid args"
                ) from None
            except Exception:
                raise ShmError("INVALID_ARG", "failed to register shared memory region: invalid args") from None
            region_id = next(self._ids)
            resolved = ResolvedRegion(name, "cuda", "", 0, byte_size, device_id, bytes(raw_handle), region_id)
            self._add(_Entry(resolved, None, device))

    def _add(self, entry: _Entry) -> None:
        self._by_name[entry.resolved.name] = entry
        self._by_id[entry.resolved.region_id] = entry

    def unregister_system(self, name: str = "") -> None:
        """Unregister one system region, or all of them when `name` is empty; unknown names are a no-op."""
        self._unregister(name, "system")

    def unregister_cuda(self, name: str = "") -> None:
        """Unregister one CUDA region, or all of them when `name` is empty; unknown names are a no-op."""
        self._unregister(name, "cuda")

    def close(self) -> None:
        """Unregister every region (server shutdown); referenced ones close on their last release."""
        self._unregister("", "system")
        self._unregister("", "cuda")

    def _unregister(self, name: str, kind: str) -> None:
        """Triton 2.73's rule: a region no request holds goes at once; one that in-flight requests hold is only
        marked (the call succeeds, status still lists it, new requests may still use it) and goes when the last
        request holding it releases it."""
        retired: list[tuple[ResolvedRegion, bool]] = []
        with self._lock:
            if name:
                entry = self._by_name.get(name)
                targets = [entry] if entry is not None and entry.resolved.kind == kind else []
            else:
                targets = [e for e in self._by_name.values() if e.resolved.kind == kind]
            for entry in targets:
                if entry.refs:
                    entry.awaiting = True
                    continue
                retired.append(self._drop(entry))
        self._notify(retired)

    def _drop(self, entry: _Entry) -> tuple[ResolvedRegion, bool]:
        """Unregister and close an entry nobody holds (lock held)."""
        del self._by_name[entry.resolved.name]
        entry.registered = False
        return self._retire(entry)

    def _retire(self, entry: _Entry) -> tuple[ResolvedRegion, bool]:
        """Close an entry (lock held); returns it with whether it was the last live user of its key/handle."""
        del self._by_id[entry.resolved.region_id]
        entry.close()
        r = entry.resolved
        last = not any((e.resolved.key, e.resolved.raw_handle) == (r.key, r.raw_handle) for e in self._by_id.values())
        return r, last

    def _notify(self, retired: list[tuple[ResolvedRegion, bool]]) -> None:
        if self.on_retire is not None:
            for region, last in retired:
                self.on_retire(region, last)

    # ---- status -------------------------------------------------------------------------------------

    def system_status(self, name: str = "") -> list[SystemRegionInfo]:
        """Registered system regions (all, or the one named); NOT_FOUND for unknown or CUDA names."""
        return [SystemRegionInfo(r.name, r.key, r.offset, r.byte_size) for r in self._status(name, "system")]

    def cuda_status(self, name: str = "") -> list[CudaRegionInfo]:
        """Registered CUDA regions (all, or the one named); NOT_FOUND for unknown or system names."""
        return [CudaRegionInfo(r.name, r.device_id, r.byte_size) for r in self._status(name, "cuda")]

    def _status(self, name: str, kind: str) -> list[ResolvedRegion]:
        with self._lock:
            if not name:
                return [e.resolved for e in self._by_name.values() if e.resolved.kind == kind]
            entry = self._by_name.get(name)
        label = {"system": "system", "cuda": "CUDA"}
        if entry is None:
            which = "system" if kind == "system" else "cuda"
            raise ShmError("NOT_FOUND", f"Unable to find {which} shared memory region: '{name}'")
        if entry.resolved.kind != kind:
            raise ShmError(
                "NOT_FOUND",
                f"The region named '{name}' is registered as {label[entry.resolved.kind]} shared memory, "
                f"not {label[kind]} shared memory",
            )
        return [entry.resolved]

    # ---- tensor references --------------------------------------------------------------------------

    def resolve(self, name: str, offset: int, byte_size: int) -> ResolvedRegion:
        """Locate `byte_size` bytes at `offset` (relative to the registered region) for a tensor.

        The result's `offset` is absolute inside the POSIX segment (registration offset + `offset`) for
        system regions, and inside the device allocation for CUDA regions.
        """
        entry = self._by_name.get(name)
        if entry is None:
            raise ShmError("NOT_FOUND", f"Unable to find shared memory region: '{name}'")
        region = entry.resolved
        if offset < 0 or offset >= region.byte_size:
            raise ShmError("INVALID_ARG", f"Invalid offset for shared memory region: '{name}'")
        if byte_size < 0 or offset + byte_size > region.byte_size:
            raise ShmError("INVALID_ARG", f"Invalid offset + byte size for shared memory region: '{name}'")
        system = entry.system
        if system is not None:  # the window is inside the region (above); is the segment still that long?
            try:
                system.check_segment(offset, byte_size)
            except SegmentTruncated as e:
                raise _truncated(name, e) from None
        windows = entry.windows
        resolved = windows.get((offset, byte_size))
        if resolved is None:
            if len(windows) >= _WINDOWS_MAX:
                windows.clear()
            resolved = windows[offset, byte_size] = ResolvedRegion(
                name,
                region.kind,
                region.key,
                region.offset + offset,
                byte_size,
                region.device_id,
                region.raw_handle,
                region.region_id,
                region.path,
            )
        return resolved

    def acquire(self, resolved: ResolvedRegion) -> None:
        """Take a reference for an in-flight request; NOT_FOUND if the region was unregistered meanwhile."""
        with self._lock:
            entry = self._by_id.get(resolved.region_id)
            if entry is None or not entry.registered:
                raise ShmError("NOT_FOUND", f"Unable to find shared memory region: '{resolved.name}'")
            entry.refs += 1

    def release(self, resolved: ResolvedRegion) -> None:
        """Drop a reference taken by acquire(); the last one closes an already unregistered region."""
        retired: list[tuple[ResolvedRegion, bool]] = []
        with self._lock:
            entry = self._by_id.get(resolved.region_id)
            if entry is None or entry.refs == 0:
                raise ShmError("INTERNAL", f"shared memory region '{resolved.name}' released more often than acquired")
            entry.refs -= 1
            if entry.refs == 0 and entry.awaiting:
                retired.append(self._drop(entry))
        if retired:  # the common case has nothing to tell: no call
            self._notify(retired)

    @contextlib.contextmanager
    def use(self, resolved: ResolvedRegion) -> Iterator[ResolvedRegion]:
        """Hold a reference to `resolved` for the duration of a with-block."""
        self.acquire(resolved)
        try:
            yield resolved
        finally:
            self.release(resolved)

    def _entry(self, resolved: ResolvedRegion) -> _Entry:
        entry = self._by_id.get(resolved.region_id)
        if entry is None:
            raise ShmError("NOT_FOUND", f"Unable to find shared memory region: '{resolved.name}'")
        return entry

    @staticmethod
    def _check_system(region: SystemRegion, name: str, offset: int, nbytes: int) -> None:
        """INVALID_ARG unless the segment still holds the bytes (a client may truncate it after registering)."""
        try:
            region.check(offset, nbytes)
        except SegmentTruncated as e:
            raise _truncated(name, e) from None

    def read(self, resolved: ResolvedRegion) -> memoryview:
        """The tensor's bytes: a zero-copy view for system regions, a host copy for CUDA regions."""
        entry = self._entry(resolved)
        relative = resolved.offset - entry.resolved.offset
        if entry.system is not None:
            self._check_system(entry.system, resolved.name, relative, resolved.byte_size)
            return entry.system.view(relative, resolved.byte_size)
        assert entry.device is not None
        return entry.device.read(relative, resolved.byte_size).data

    def ndarray(self, resolved: ResolvedRegion, datatype: str, shape: Sequence[int]) -> np.ndarray:
        """The tensor as an array: a zero-copy view (fixed types, system regions) or a decoded copy."""
        return buffer_to_numpy(self.read(resolved), datatype, shape)

    def write(self, resolved: ResolvedRegion, data: bytes | bytearray | memoryview | np.ndarray) -> int:
        """Copy output bytes (or an array in wire layout, BYTES serialized) into the tensor's window.

        Returns the number of bytes written. Raises INTERNAL when the data does not fit; the server should
        check first and report Triton's "shared memory size specified with the request for output ..."
        message itself.
        """
        entry = self._entry(resolved)
        raw = numpy_to_raw(data) if isinstance(data, np.ndarray) else data
        nbytes = memoryview(raw).nbytes
        if nbytes > resolved.byte_size:
            raise ShmError(
                "INTERNAL",
                f"{nbytes} bytes do not fit in the {resolved.byte_size} bytes requested from shared memory "
                f"region '{resolved.name}'",
            )
        relative = resolved.offset - entry.resolved.offset
        if entry.system is not None:
            self._check_system(entry.system, resolved.name, relative, nbytes)
            return entry.system.write(relative, raw)
        assert entry.device is not None
        return entry.device.write(relative, raw)
