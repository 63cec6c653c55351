"""Server-side SharedMemoryRegistry: Triton's register/status/unregister semantics, bounds and lifetimes."""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pickle
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import tritonclient.utils.shared_memory as tshm

from shm.cuda import cuda_available
from shm.errors import ShmError
from shm.registry import CudaRegionInfo, ResolvedRegion, SharedMemoryRegistry, SystemRegionInfo
from shm.system import SystemRegion, segment_size
from shm.views import as_byte_view

ClientRegion = Callable[[int], tuple[str, tshm.SharedMemoryRegion]]


def mappings(key: str) -> int:
    """How many mappings of the segment `key` this process holds."""
    path = "/dev/shm/" + key.lstrip("/")
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if line.rstrip("\n").removesuffix(" (deleted)").endswith(path))


@pytest.fixture
def client_region() -> Iterator[ClientRegion]:
    """Factory of tritonclient-created regions; destroyed at teardown, which fails if any segment is left."""
    prefix = f"trireme_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    counter = itertools.count()
    handles: list[tshm.SharedMemoryRegion] = []

    def make(byte_size: int) -> tuple[str, tshm.SharedMemoryRegion]:
        key = f"/{prefix}_{next(counter)}"
        handles.append(tshm.create_shared_memory_region(key[1:], key, byte_size, create_only=True))
        return key, handles[-1]

    yield make
    for handle in handles:
        tshm.destroy_shared_memory_region(handle)
    leftovers = glob.glob(f"/dev/shm/{prefix}*")
    for path in leftovers:
        os.unlink(path)
    assert not leftovers, f"segments left behind: {leftovers}"


class FakeDeviceRegion:
    """Host-memory stand-in for an opened CUDA region."""

    def __init__(self, byte_size: int) -> None:
        self.storage = bytearray(byte_size)
        self.closed = False

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        return np.frombuffer(bytes(self.storage[offset : offset + nbytes]), dtype=np.uint8)

    def write(self, offset: int, data: bytes | bytearray | memoryview | np.ndarray) -> int:
        raw = as_byte_view(data)
        self.storage[offset : offset + len(raw)] = raw
        return len(raw)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_devices() -> list[FakeDeviceRegion]:
    """Device regions opened by the `registry` fixture's fake CUDA opener, in order."""
    return []


@pytest.fixture
def registry(fake_devices: list[FakeDeviceRegion]) -> Iterator[SharedMemoryRegistry]:
    """A registry whose CUDA regions are host-memory fakes; closed at teardown."""

    def opener(raw_handle: bytes, byte_size: int, device_id: int) -> FakeDeviceRegion:
        if raw_handle.startswith(b"too-small"):
            raise ValueError("byte_size exceeds the allocation")
        if raw_handle.startswith(b"bad"):
            raise RuntimeError("cudaErrorInvalidValue")
        fake_devices.append(FakeDeviceRegion(byte_size))
        return fake_devices[-1]

    reg = SharedMemoryRegistry(cuda_opener=opener)
    yield reg
    reg.close()


HANDLE = b"h" * 64


@contextlib.contextmanager
def expect(code: str, message: str) -> Iterator[None]:
    """Expect a ShmError with exactly this code and message."""
    with pytest.raises(ShmError) as excinfo:
        yield
    assert (excinfo.value.code, excinfo.value.message) == (code, message)


def test_register_status_resolve_read_write(registry: SharedMemoryRegistry, client_region: ClientRegion) -> None:
    key, handle = client_region(128)
    tshm.set_shared_memory_region(handle, [np.arange(8, dtype=np.float32)])
    registry.register_system("input_data", key, 0, 128)
    assert registry.system_status() == [SystemRegionInfo("input_data", key, 0, 128)]
    assert registry.system_status("input_data") == [SystemRegionInfo("input_data", key, 0, 128)]
    assert registry.cuda_status() == []

    resolved = registry.resolve("input_data", 0, 32)
    assert (resolved.kind, resolved.key, resolved.offset, resolved.byte_size) == ("system", key, 0, 32)
    assert bytes(registry.read(resolved)) == np.arange(8, dtype=np.float32).tobytes()
    np.testing.assert_array_equal(registry.ndarray(resolved, "FP32", [2, 4]), np.arange(8).reshape(2, 4))

    output = registry.resolve("input_data", 64, 64)
    assert registry.write(output, np.full(16, 2.5, np.float32)) == 64
    np.testing.assert_array_equal(tshm.get_contents_as_numpy(handle, np.float32, [16], 64), np.full(16, 2.5))


def test_a_name_registered_again_resolves_to_its_new_segment(
    registry: SharedMemoryRegistry, client_region: ClientRegion
) -> None:
    # resolved windows are kept per registration: the same name over another segment must not answer the old one
    first, first_handle = client_region(64)
    second, second_handle = client_region(64)
    tshm.set_shared_memory_region(first_handle, [np.full(4, 1.0, np.float32)])
    tshm.set_shared_memory_region(second_handle, [np.full(4, 2.0, np.float32)])
    registry.register_system("r", first, 0, 64)
    before = registry.resolve("r", 0, 16)
    assert registry.resolve("r", 0, 16) == before and registry.resolve("r", 16, 16).offset == 16
    registry.unregister_system("r")
    registry.register_system("r", second, 0, 64)
    after = registry.resolve("r", 0, 16)
    assert (after.key, after.region_id) == (second, before.region_id + 1)
    np.testing.assert_array_equal(registry.ndarray(after, "FP32", [4]), np.full(4, 2.0))
    with pytest.raises(ShmError, match="Invalid offset"):  # the checks still run for a window resolved before
        registry.resolve("r", 64, 0)


def test_non_aligned_registration_offset(registry: SharedMemoryRegistry, client_region: ClientRegion) -> None:
    key, handle = client_region(3 * 4096)
    data = np.arange(100, dtype=np.int16)
    tshm.set_shared_memory_region(handle, [data], offset=4099 + 10)
    registry.register_system("r", key.lstrip("/"), 4099, 1000)
    resolved = registry.resolve("r", 10, data.nbytes)
    assert resolved.offset == 4109
    np.testing.assert_array_equal(registry.ndarray(resolved, "INT16", [100]), data)
    # A worker process maps the same bytes from the resolved reference alone.
    with SystemRegion.open(resolved.key, resolved.offset, resolved.byte_size) as worker:
        assert bytes(worker.buffer) == data.tobytes()
    assert pickle.loads(pickle.dumps(resolved)) == resolved


def test_bytes_tensors(registry: SharedMemoryRegistry, client_region: ClientRegion) -> None:
    key, handle = client_region(64)
    values = np.array([b"one", b"", b"three"], dtype=np.object_)
    registry.register_system("s", key, 0, 64)
    out = registry.resolve("s", 8, 32)
    assert registry.write(out, values) == 3 * 4 + 8
    np.testing.assert_array_equal(tshm.get_contents_as_numpy(handle, np.object_, [3], 8), values)
    np.testing.assert_array_equal(registry.ndarray(out, "BYTES", [3]), values)


@pytest.mark.parametrize("key", ["", "/", "//", "/a/b", "..", "a\0b", "k" * 256])
def test_invalid_key(registry: SharedMemoryRegistry, key: str) -> None:
    with expect("INVALID_ARG", f"cannot register shared memory region 'r' - invalid shm key '{key}'"):
        registry.register_system("r", key, 0, 8)


def test_reserved_key_prefix(registry: SharedMemoryRegistry) -> None:
    key = "/triton_python_backend_shm_region_x"
    message = (
        f"cannot register shared memory region 'r' with key '{key}' as the key contains the reserved prefix "
        "'triton_python_backend_shm_region_'"
    )
    with expect("INVALID_ARG", message):
        registry.register_system("r", key, 0, 8)


def test_register_errors(registry: SharedMemoryRegistry, client_region: ClientRegion) -> None:
    key, _ = client_region(100)
    missing = key + "_missing"
    with expect("INTERNAL", f"Unable to open shared memory region: '{missing}'"):
        registry.register_system("r", missing, 0, 8)
    for offset, byte_size in [(0, 101), (99, 2), (100, 1), (-1, 8), (0, -8), (2**64 - 1, 2**64 - 1)]:
        with expect("INVALID_ARG", "failed to register shared memory region 'r': invalid args"):
            registry.register_system("r", key, offset, byte_size)
    registry.register_system("r", key, 0, 100)
    with expect("ALREADY_EXISTS", "shared memory region 'r' already in manager"):
        registry.register_system("r", key, 0, 10)
    with expect("ALREADY_EXISTS", "shared memory region 'r' already in manager"):
        registry.register_cuda("r", HANDLE, 0, 10)
    registry.register_cuda("c", HANDLE, 0, 10)
    with expect("ALREADY_EXISTS", "shared memory region 'c' already in manager"):
        registry.register_system("c", key, 0, 10)
    # Several regions may share one segment.
    registry.register_system("r2", key, 10, 20)
    assert [info.name for info in registry.system_status()] == ["r", "r2"]


def test_resolve_errors(registry: SharedMemoryRegistry, client_region: ClientRegion) -> None:
    key, _ = client_region(100)
    registry.register_system("r", key, 20, 50)
    with expect("NOT_FOUND", "Unable to find shared memory region: 'nope'"):
        registry.resolve("nope", 0, 1)
    for offset in [50, 51, -1, 2**64 - 1]:
        with expect("INVALID_ARG", "Invalid offset for shared memory region: 'r'"):
            registry.resolve("r", offset, 0)
    for offset, byte_size in [(0, 51), (49, 2), (10, -1), (1, 2**64 - 1)]:
        with expect("INVALID_ARG", "Invalid offset + byte size for shared memory region: 'r'"):
            registry.resolve("r", offset, byte_size)
    assert registry.resolve("r", 49, 1).offset == 69
    assert registry.resolve("r", 0, 50).byte_size == 50


def test_resolve_checks_the_segment_size_on_every_request(
    registry: SharedMemoryRegistry, client_region: ClientRegion
) -> None:
    """A window resolved before (and cached) is refused once the client truncates the segment under it, and
    served again once the segment has grown back; what still fits keeps being served in between."""
    key, _ = client_region(8192)
    registry.register_system("r", key, 4096, 4096)
    assert registry.resolve("r", 1024, 2048).offset == 5120
    fd = os.open("/dev/shm/" + key.lstrip("/"), os.O_RDWR)
    try:
        os.ftruncate(fd, 6000)
        with expect(
            "INVALID_ARG",
            f"Invalid shared memory region: 'r': shared memory object '{key}' holds 6000 bytes, too few for 2048 "
            "bytes at offset 5120: it was truncated after registration",
        ):
            registry.resolve("r", 1024, 2048)
        assert registry.resolve("r", 0, 1904).byte_size == 1904  # ends at byte 6000: still inside
        os.ftruncate(fd, 8192)
        assert registry.resolve("r", 1024, 2048).offset == 5120
    finally:
        os.close(fd)


def test_status_errors(registry: SharedMemoryRegistry, client_region: ClientRegion) -> None:
    key, _ = client_region(16)
    registry.register_system("sys", key, 0, 16)
    registry.register_cuda("gpu", HANDLE, 1, 8)
    assert registry.cuda_status() == [CudaRegionInfo("gpu", 1, 8)]
    cases = [
        (registry.system_status, "x", "Unable to find system shared memory region: 'x'"),
        (registry.cuda_status, "x", "Unable to find cuda shared memory region: 'x'"),
        (
            registry.system_status,
            "gpu",
            "The region named 'gpu' is registered as CUDA shared memory, not system shared memory",
        ),
        (
            registry.cuda_status,
            "sys",
            "The region named 'sys' is registered as system shared memory, not CUDA shared memory",
        ),
    ]
    for status, name, message in cases:
        with expect("NOT_FOUND", message):
            status(name)


def test_cuda_registration_errors(registry: SharedMemoryRegistry) -> None:
    with expect("INVALID_ARG", "failed to register shared memory region: invalid args"):
        registry.register_cuda("c", b"short", 0, 8)
    with expect("INVALID_ARG", "failed to register shared memory region: invalid args"):
        registry.register_cuda("c", b"bad".ljust(64, b"\0"), 0, 8)
    with expect("INVALID_ARG", "failed to register shared memory region 'c': invalid args"):
        registry.register_cuda("c", b"too-small".ljust(64, b"\0"), 0, 8)
    assert registry.cuda_status() == []


@pytest.mark.skipif(cuda_available(), reason="checks the CPU-only answer")
def test_cuda_without_gpu() -> None:
    registry = SharedMemoryRegistry()
    message = "failed to register shared memory region: invalid args"
    with expect("INVALID_ARG", message):
        registry.register_cuda("c", HANDLE, 0, 8)
    with expect("INVALID_ARG", message):
        registry.register_cuda("c", b"short", -1, -1)
    registry.unregister_cuda()
    registry.unregister_cuda("c")
    assert registry.cuda_status() == []


def test_cuda_resolve_read_write(registry: SharedMemoryRegistry, fake_devices: list[FakeDeviceRegion]) -> None:
    registry.register_cuda("gpu", HANDLE, 2, 32)
    resolved = registry.resolve("gpu", 8, 16)
    assert (resolved.kind, resolved.offset, resolved.device_id, resolved.raw_handle) == ("cuda", 8, 2, HANDLE)
    registry.write(resolved, np.arange(4, dtype=np.int32))
    assert bytes(fake_devices[0].storage[8:24]) == np.arange(4, dtype=np.int32).tobytes()
    np.testing.assert_array_equal(registry.ndarray(resolved, "INT32", [4]), np.arange(4))
    registry.unregister_cuda("gpu")
    assert fake_devices[0].closed


def test_unregister(registry: SharedMemoryRegistry, client_region: ClientRegion) -> None:
    key_a, _ = client_region(16)
    key_b, _ = client_region(16)
    registry.register_system("a", key_a, 0, 16)
    registry.register_system("b", key_b, 0, 16)
    registry.register_cuda("gpu", HANDLE, 0, 8)
    registry.unregister_system("unknown")
    registry.unregister_system("gpu")  # a CUDA name is not a system region: no-op
    registry.unregister_cuda("a")  # and the other way round
    assert len(registry.system_status()) == 2
    assert mappings(key_a) == 2  # tritonclient's and the registry's
    registry.unregister_system("a")
    assert mappings(key_a) == 1
    assert [info.name for info in registry.system_status()] == ["b"]
    registry.unregister_system()
    assert registry.system_status() == []
    assert mappings(key_b) == 1
    assert registry.cuda_status() == [CudaRegionInfo("gpu", 0, 8)]
    registry.unregister_cuda()
    assert registry.cuda_status() == []
    registry.unregister_system()
    registry.unregister_cuda()
    # The registry never unlinks a client's segment.
    assert segment_size(key_a) == 16
    with pytest.raises(ShmError):
        registry.resolve("a", 0, 1)


def test_unregister_in_flight_waits_for_the_last_request(
    registry: SharedMemoryRegistry, client_region: ClientRegion
) -> None:
    """Triton 2.73: unregistering a region in use succeeds and only marks it; status still lists it, new requests
    may still use it, its name stays taken, and it goes when the last request holding it releases it."""
    key, handle = client_region(64)
    registry.register_system("r", key, 0, 64)
    resolved = registry.resolve("r", 0, 16)
    with registry.use(resolved):
        registry.unregister_system("r")
        assert [r.name for r in registry.system_status()] == ["r"]
        assert mappings(key) == 2  # still mapped for the in-flight request
        later = registry.resolve("r", 16, 16)  # a request that comes meanwhile still finds it
        registry.acquire(later)
        tshm.set_shared_memory_region(handle, [np.arange(4, dtype=np.int32)])
        np.testing.assert_array_equal(registry.ndarray(resolved, "INT32", [4]), np.arange(4))
        registry.write(resolved, b"\x09")
        with expect("ALREADY_EXISTS", "shared memory region 'r' already in manager"):
            registry.register_system("r", key, 32, 32)
    assert [r.name for r in registry.system_status()] == ["r"]  # the later request still holds it
    registry.release(later)
    assert registry.system_status() == []
    assert mappings(key) == 1
    with expect("NOT_FOUND", "Unable to find shared memory region: 'r'"):
        registry.read(resolved)
    assert tshm.get_contents_as_numpy(handle, np.uint8, [1])[0] == 9
    registry.register_system("r", key, 32, 32)  # the name is free once it went


def test_reference_counting(registry: SharedMemoryRegistry, client_region: ClientRegion) -> None:
    key, _ = client_region(16)
    registry.register_system("r", key, 0, 16)
    first, second = registry.resolve("r", 0, 8), registry.resolve("r", 8, 8)
    registry.acquire(first)
    registry.acquire(second)
    registry.unregister_system()
    registry.release(first)
    assert mappings(key) == 2
    registry.release(second)
    assert mappings(key) == 1
    with expect("INTERNAL", "shared memory region 'r' released more often than acquired"):
        registry.release(second)


def test_live_array_defers_unmap(registry: SharedMemoryRegistry, client_region: ClientRegion) -> None:
    key, handle = client_region(16)
    tshm.set_shared_memory_region(handle, [np.arange(4, dtype=np.float32)])
    registry.register_system("r", key, 0, 16)
    array = registry.ndarray(registry.resolve("r", 0, 16), "FP32", [4])
    registry.unregister_system("r")
    assert mappings(key) == 2
    np.testing.assert_array_equal(array, np.arange(4))
    del array
    assert mappings(key) == 1


def test_write_too_large(registry: SharedMemoryRegistry, client_region: ClientRegion) -> None:
    key, _ = client_region(16)
    registry.register_system("r", key, 0, 16)
    resolved = registry.resolve("r", 4, 4)
    message = "8 bytes do not fit in the 4 bytes requested from shared memory region 'r'"
    with expect("INTERNAL", message):
        registry.write(resolved, np.zeros(2, np.float32))
    with expect("INTERNAL", message.replace("8 bytes", "5 bytes")):
        registry.write(resolved, b"12345")


def test_shm_error_round_trips() -> None:
    error = ShmError("NOT_FOUND", "Unable to find shared memory region: 'x'")
    clone = pickle.loads(pickle.dumps(error))
    assert (clone.code, str(clone)) == ("NOT_FOUND", "Unable to find shared memory region: 'x'")
    assert isinstance(pickle.loads(pickle.dumps(ResolvedRegion("n", "cuda", "", 0, 1, 0, HANDLE, 3))), ResolvedRegion)
