"""GrowingArena over real POSIX segments: a writer and a reader (as the server and a worker hold them) agree on
virtual offsets across grown segments, blocks never straddle segments, and names do not outlive the mappings."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from service.ipc.arena import ArenaMap, GrowingArena

KIB = 1 << 10


@pytest.fixture
def pair() -> Iterator[tuple[GrowingArena, GrowingArena]]:
    name = f"/trireme_{os.getpid()}_unit{uuid.uuid4().hex[:8]}"
    writer = GrowingArena(ArenaMap(name, 64 * KIB, create=True), growth_bytes=64 * KIB)
    reader = GrowingArena(ArenaMap(name, 0, create=False), growth_bytes=64 * KIB)
    yield writer, reader
    writer.unlink()
    writer.close()
    reader.close()


def shm_names(base: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(base.lstrip("/"))]


def test_blocks_beyond_the_first_segment_are_read_through_new_segments(
    pair: tuple[GrowingArena, GrowingArena],
) -> None:
    writer, reader = pair
    blocks = []
    for i, size in enumerate([40 * KIB, 40 * KIB, 200 * KIB, 10 * KIB]):
        offset = writer.alloc(size)
        payload = bytes([i + 1]) * size
        writer.buffer[offset : offset + size] = payload
        blocks.append((offset, payload))
    assert len(writer.segments) == 3  # 64 KiB, then 64 KiB for the second 40 KiB block, then 256 KiB for 200 KiB
    assert writer.segments[2].size == 256 * KIB
    for offset, payload in blocks:
        assert bytes(reader.buffer[offset : offset + len(payload)]) == payload
    assert len(reader.segments) == 3
    # the reader unlinked the names of the segments it mapped; only the first one's name is left (unlinked later)
    assert shm_names(writer.name) == [writer.name.lstrip("/")]


def test_freed_space_is_reused_before_growing(pair: tuple[GrowingArena, GrowingArena]) -> None:
    writer, _ = pair
    a = writer.alloc(60 * KIB)
    writer.free(a)
    assert writer.alloc(60 * KIB) == a
    b = writer.alloc(60 * KIB)  # grows
    assert b >= 64 * KIB and len(writer.segments) == 2
    writer.free(b)
    writer.free(12345)  # unknown offsets are ignored
    assert writer.alloc(60 * KIB) == b


def test_unlink_removes_names_the_reader_never_mapped(pair: tuple[GrowingArena, GrowingArena]) -> None:
    writer, _ = pair
    writer.alloc(100 * KIB)
    assert len(shm_names(writer.name)) == 2
    writer.unlink()
    assert shm_names(writer.name) == []
