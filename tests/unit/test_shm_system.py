"""POSIX regions of shm.system against the real tritonclient.utils.shared_memory."""

from __future__ import annotations

import glob
import itertools
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.utils.shared_memory as tshm
from tritonclient.utils import serialize_byte_tensor

from shm.system import SystemRegion, segment_size, unlink, validate_key

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGE = 4096


def mappings(key: str) -> int:
    """How many mappings of the segment `key` this process holds."""
    path = "/dev/shm/" + key.lstrip("/")
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if line.rstrip("\n").removesuffix(" (deleted)").endswith(path))


@pytest.fixture
def shm_key() -> Iterator[Callable[[], str]]:
    """Factory of unique keys; fails the test if a segment with one of them is left in /dev/shm."""
    prefix = f"trireme_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    counter = itertools.count()
    yield lambda: f"/{prefix}_{next(counter)}"
    leftovers = glob.glob(f"/dev/shm/{prefix}*")
    for path in leftovers:
        os.unlink(path)
    assert not leftovers, f"segments left behind: {leftovers}"


@pytest.fixture
def client_region(
    shm_key: Callable[[], str],
) -> Iterator[Callable[[int], tuple[str, tshm.SharedMemoryRegion]]]:
    """Factory of regions created by tritonclient (as a client would); destroyed at teardown."""
    handles: list[tshm.SharedMemoryRegion] = []

    def make(byte_size: int) -> tuple[str, tshm.SharedMemoryRegion]:
        key = shm_key()
        handle = tshm.create_shared_memory_region(key.strip("/"), key, byte_size, create_only=True)
        handles.append(handle)
        return key, handle

    yield make
    for handle in handles:
        tshm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("/input_simple", "/input_simple"),
        ("input_simple", "/input_simple"),
        ("//x", "/x"),
        ("a" * 255, "/" + "a" * 255),
    ],
)
def test_validate_key_accepts_tritonclient_keys(key: str, name: str) -> None:
    assert validate_key(key) == name


@pytest.mark.parametrize("key", ["", "/", "///", "/a/b", "a/b", "..", "/..", ".", "a\0b", "x" * 256])
def test_validate_key_rejects(key: str) -> None:
    with pytest.raises(ValueError):
        validate_key(key)


def test_reads_what_tritonclient_wrote(
    client_region: Callable[[int], tuple[str, tshm.SharedMemoryRegion]],
) -> None:
    key, handle = client_region(64)
    data = np.arange(16, dtype=np.float32)
    tshm.set_shared_memory_region(handle, [data])
    assert segment_size(key) == 64
    with SystemRegion.open(key) as region:
        assert region.byte_size == 64
        assert bytes(region.buffer) == data.tobytes()
        np.testing.assert_array_equal(region.ndarray("FP32", [4, 4]), data.reshape(4, 4))


@pytest.mark.parametrize("offset", [1, PAGE - 1, PAGE, PAGE + 1, 5000])
def test_non_page_aligned_window(
    client_region: Callable[[int], tuple[str, tshm.SharedMemoryRegion]], offset: int
) -> None:
    key, handle = client_region(3 * PAGE + 100)
    data = np.arange(10, dtype=np.int64)
    tshm.set_shared_memory_region(handle, [data], offset=offset)
    with SystemRegion.open(key.lstrip("/"), offset=offset, byte_size=data.nbytes) as region:
        assert region.offset == offset
        assert bytes(region.buffer) == data.tobytes()
        region.write(8, np.array([-5], dtype=np.int64))
        expected = data.copy()
        expected[1] = -5
        np.testing.assert_array_equal(tshm.get_contents_as_numpy(handle, np.int64, [10], offset), expected)


def test_ndarray_is_zero_copy(client_region: Callable[[int], tuple[str, tshm.SharedMemoryRegion]]) -> None:
    key, handle = client_region(32)
    with SystemRegion.open(key, offset=16) as region:
        view = region.ndarray("INT32", [4])
        view[:] = [1, 2, 3, 4]
        np.testing.assert_array_equal(tshm.get_contents_as_numpy(handle, np.int32, [4], 16), [1, 2, 3, 4])
        del view


def test_read_only_open(client_region: Callable[[int], tuple[str, tshm.SharedMemoryRegion]]) -> None:
    key, _ = client_region(16)
    with SystemRegion.open(key, writable=False) as region:
        array = region.ndarray("UINT8", [16])
        assert not array.flags.writeable
        with pytest.raises(TypeError):
            region.write(0, b"x")
        del array


def test_bytes_tensors_both_ways(client_region: Callable[[int], tuple[str, tshm.SharedMemoryRegion]]) -> None:
    key, handle = client_region(256)
    values = np.array([[b"hello", b""], [b"\x00\xff", "wörld".encode()]], dtype=np.object_)
    serialized = serialize_byte_tensor(values)
    tshm.set_shared_memory_region(handle, [serialized], offset=3)
    with SystemRegion.open(key) as region:
        # The region is larger than the tensor: only the first 4 elements are parsed.
        np.testing.assert_array_equal(region.ndarray("BYTES", [2, 2], offset=3), values)
        written = region.write(100, np.array([b"ab", b"cde"], dtype=np.object_))
        assert written == 4 + 2 + 4 + 3
    result = tshm.get_contents_as_numpy(handle, np.object_, [2], offset=100)
    np.testing.assert_array_equal(result, np.array([b"ab", b"cde"], dtype=np.object_))


def test_malformed_bytes_raise(shm_key: Callable[[], str]) -> None:
    with SystemRegion.create(shm_key(), 8) as region:
        region.write(0, (100).to_bytes(4, "little") + b"abcd")
        with pytest.raises(ValueError):
            region.ndarray("BYTES", [1])
        with pytest.raises(ValueError):
            region.ndarray("BYTES", [1], offset=6)


def test_create_open_destroy(shm_key: Callable[[], str]) -> None:
    key = shm_key()
    with SystemRegion.create(key, 100) as owner:
        owner.write(10, b"abc")
        with pytest.raises(FileExistsError):
            SystemRegion.create(key, 100)
        with SystemRegion.open(key, 10, 3) as reader:
            assert bytes(reader.buffer) == b"abc"
        assert segment_size(key) == 100  # closing a non-owner does not unlink
    with pytest.raises(FileNotFoundError):
        segment_size(key)


def test_open_errors(shm_key: Callable[[], str]) -> None:
    key = shm_key()
    with pytest.raises(FileNotFoundError):
        SystemRegion.open(key)
    with pytest.raises(FileNotFoundError):
        unlink(key)
    with SystemRegion.create(key, 100):
        for offset, size in [(0, 101), (100, 1), (-1, 10), (0, -1), (101, None)]:
            with pytest.raises(ValueError):
                SystemRegion.open(key, offset, size)
        with SystemRegion.open(key, 100) as empty:
            assert empty.byte_size == 0
            assert bytes(empty.buffer) == b""


def test_bounds_and_datatypes(shm_key: Callable[[], str]) -> None:
    with SystemRegion.create(shm_key(), 16) as region:
        with pytest.raises(ValueError):
            region.view(8, 9)
        with pytest.raises(ValueError):
            region.write(15, b"ab")
        with pytest.raises(ValueError):
            region.ndarray("FP32", [5])
        with pytest.raises(ValueError):
            region.ndarray("BF16", [2])
        with pytest.raises(ValueError):
            region.ndarray("NOPE", [2])
        assert region.ndarray("FP64", [0]).shape == (0,)


def test_close_defers_unmap_while_a_view_lives(shm_key: Callable[[], str]) -> None:
    key = shm_key()
    with SystemRegion.create(key, 64) as region:
        region.write(0, np.arange(16, dtype=np.float32))
        view = region.ndarray("FP32", [16])
        raw = region.view(0, 4)
        assert mappings(key) == 1
        assert region.close() is False
        assert region.closed
        assert mappings(key) == 1
        assert view[3] == 3.0
        del view
        assert mappings(key) == 1
        del raw
        assert mappings(key) == 0
        with pytest.raises(ValueError):
            _ = region.buffer
        assert region.close() is True


def test_close_unmaps_at_once_without_views(shm_key: Callable[[], str]) -> None:
    key = shm_key()
    with SystemRegion.create(key, 64) as region:
        assert mappings(key) == 1
        assert region.close() is True
        assert mappings(key) == 0


def test_opening_in_another_process_leaves_the_segment(
    client_region: Callable[[int], tuple[str, tshm.SharedMemoryRegion]],
) -> None:
    key, handle = client_region(16)
    script = (
        "import sys\nfrom shm.system import SystemRegion\n"
        "with SystemRegion.open(sys.argv[1], 4, 4) as r:\n    r.write(0, b'ping')\n"
    )
    subprocess.run([sys.executable, "-c", script, key], cwd=REPO_ROOT, check=True, timeout=60)
    # A resource_tracker registration in the child would have unlinked the segment when it exited.
    assert segment_size(key) == 16
    assert bytes(tshm.get_contents_as_numpy(handle, np.uint8, [4], 4)) == b"ping"


def test_truncated_segment_is_refused_not_touched(shm_key: Callable[[], str]) -> None:
    """Reading or writing past the end of a truncated segment would SIGBUS; every access checks its size."""
    from service.worker.channel import ClientSegments
    from shm.system import SegmentTruncated

    key = shm_key()
    owner = SystemRegion.create(key, 65536)
    opened = SystemRegion.open(key, 0, 65536)
    segments = ClientSegments()
    try:
        segments.buffer(key, 32768, 16)[32768:32784] = b"x" * 16  # mapped (and cached) at full size
        fd = os.open(f"/dev/shm/{key.lstrip('/')}", os.O_RDWR)
        os.ftruncate(fd, 4096)
        os.close(fd)
        expected = (
            f"shared memory object '{key}' holds 4096 bytes, too few for 16 bytes at offset 32768: it was "
            "truncated after registration"
        )
        with pytest.raises(SegmentTruncated) as worker_side:
            segments.buffer(key, 32768, 16)
        assert str(worker_side.value) == expected
        with pytest.raises(SegmentTruncated) as server_side:
            opened.view(32768, 16)
        assert str(server_side.value) == expected
        with pytest.raises(SegmentTruncated):
            opened.write(32768, b"y" * 16)
        assert bytes(segments.buffer(key, 0, 16)[:4]) == b"\0\0\0\0"  # what is left still works
        assert bytes(opened.view(4000, 96)) == b"\0" * 96
    finally:
        segments.drop([key])
        opened.close()
        owner.destroy()
