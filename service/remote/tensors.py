"""Tensor bytes between a front-end process and the core: large ones through shared-memory arenas, not frames.

Inline in a pickled frame, a 64 MiB tensor was copied six times on the two event loops (bytes(), pickle, the
frame's header, the reader's buffer, unpickling) besides the socket's own two copies. Instead, each side writes
the tensors it sends (front end: request inputs; core: response outputs) into an arena of its own, created on the
first large tensor and grown like the worker arenas, and the frame carries (arena name, offset, nbytes). The
other side maps the arena by name and reads the block in place: one copy in all, made by a thread when large.

The reader gives a block back (an ("f", [offsets]) frame) when its last reference to the block is gone; only then
does the writer reuse it. So a view something still holds (an in-process model's output that is its input, a
sequence's state) never sees its bytes change. Tensors under LINK_ARENA_BYTES, and any tensor when /dev/shm cannot
hold the arena, travel inline as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.ipc.arena import ArenaMap, GrowingArena, ShmPoolExhausted, segment_name
from service.ipc.blocks import THREAD_COPY_BYTES, Copy, lent_view

LINK_ARENA_BYTES = 64 << 10  # below this a tensor rides in its frame (as the worker frames' INLINE_LIMIT)
GROWTH_BYTES = 16 << 20

Ref = tuple[str, int, int]  # (arena name, offset, nbytes)


class LinkTensors:
    """One side of a front-end link: the arena it writes and the other side's arenas it reads."""

    def __init__(self, tag: str, give_back: Callable[[list[int]], None]) -> None:
        self.tag = tag  # this side's arena is segment_name(tag)
        self._give_back = give_back  # sends ("f", offsets) to the other side
        self.arena: GrowingArena | None = None
        self.lent: set[int] = set()  # offsets of our blocks the other side has not given back
        self.peers: dict[str, GrowingArena] = {}
        self.pending: list[Copy] = []  # large copies place() left for the caller to make (by a thread)
        self.pending_offsets: list[int] = []

    # ---- writer ---------------------------------------------------------------------------------------------
    def place(self, data: Any) -> bytes | Ref | None:
        """What a frame carries for `data`: its bytes, or a reference to a block of this side's arena now
        holding them (a large one is only reserved: its copy is appended to `pending` for the caller)."""
        if data is None:
            return None
        view = memoryview(data)
        n = view.nbytes
        if n < LINK_ARENA_BYTES:
            return bytes(data)
        offset = self._alloc(n)
        if offset is None:
            return bytes(data)
        assert self.arena is not None
        block = self.arena.buffer[offset : offset + n]
        if view.format != "B" or view.ndim != 1:  # e.g. an in-process model's array: its bytes in memory order
            view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
        if n >= THREAD_COPY_BYTES:
            self.pending.append((block, view))
            self.pending_offsets.append(offset)
        else:
            block[:] = view
        self.lent.add(offset)
        return (self.arena.name, offset, n)

    def take_pending(self) -> tuple[list[Copy], list[int]]:
        """The copies place() left since the last call, and their blocks' offsets."""
        copies, offsets = self.pending, self.pending_offsets
        self.pending, self.pending_offsets = [], []
        return copies, offsets

    def _alloc(self, n: int) -> int | None:
        try:
            if self.arena is None:
                size = -(-n // GROWTH_BYTES) * GROWTH_BYTES
                self.arena = GrowingArena(ArenaMap(segment_name(self.tag), size, True, True), GROWTH_BYTES)
            return self.arena.alloc(n)
        except ShmPoolExhausted:  # /dev/shm is full: the frame carries the bytes
            return None

    def free(self, offsets: list[int]) -> None:
        """The other side is done with these blocks of ours."""
        if self.arena is None:
            return
        for offset in offsets:
            if offset in self.lent:  # never twice, and never a block the other side did not hold
                self.lent.discard(offset)
                self.arena.free(offset)

    # ---- reader ---------------------------------------------------------------------------------------------
    def resolve(self, data: Any) -> Any:
        """place()'s inverse: bytes as they came, a reference as a view of the other side's block (given back
        once the last reference to the view is gone)."""
        if type(data) is not tuple:
            return data
        name, offset, n = data
        arena = self.peers.get(name)
        if arena is None:
            first = ArenaMap(name, 0, create=False)
            first.unlink()  # both sides have it mapped now: nothing is left in /dev/shm if either dies
            arena = self.peers[name] = GrowingArena(first, GROWTH_BYTES)
        return lent_view(arena.buffer[offset : offset + n], offset, self._give_back_one)

    def _give_back_one(self, offset: int) -> None:
        self._give_back([offset])

    # ---- both ---------------------------------------------------------------------------------------------
    def close(self) -> None:
        """The link is gone: remove our arena's names and unmap (views still held keep their mapping)."""
        if self.arena is not None:
            self.arena.unlink()
            self.arena.close()
            self.arena = None
        for arena in self.peers.values():
            arena.unlink()
            arena.close()
        self.peers.clear()
