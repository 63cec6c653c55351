"""Arena blocks lent across a process boundary: the reader's view that gives its block back when it is dropped,
and large copies into an arena made by a thread with the frames that need them sent in order.

Both server-side process boundaries use these: the worker's output arena (service/instances/transfer.py) and
the tensor arenas between front-end processes and the core (service/remote/tensors.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

THREAD_COPY_BYTES = 4 << 20  # blocks this large are filled by a thread, off the event loop
# output blocks this large are lent to the reader (lent_view) rather than copied out at once: below it a copy is
# cheaper than the view's finalizer and the give-back frame of its own (the gRPC front end's one-copy serialiser
# takes responses from the same size on)
LEND_BYTES = 256 << 10

Copy = tuple[memoryview, Any]  # (arena view, source bytes of the same length)


def copy_into(copies: list[Copy]) -> None:
    """Fill each arena view from its source (numpy releases the GIL while it copies)."""
    for target, data in copies:
        np.copyto(np.frombuffer(target, np.uint8), np.frombuffer(data, np.uint8))


def lent_view(block: memoryview, offset: int, give_back: Callable[[int], None]) -> memoryview:
    """A view of an arena block owned by the other side: `give_back(offset)` runs on this event loop once the
    last reference to the view (or anything made from it) is gone, from whichever thread dropped it."""
    array = np.frombuffer(block, np.uint8)
    weakref.finalize(array, _soon, asyncio.get_running_loop(), give_back, offset)
    return array.data  # keeps the array (and so the block) alive as long as it is referenced


def _soon(loop: asyncio.AbstractEventLoop, give_back: Callable[[int], None], offset: int) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: the process is going away
        loop.call_soon_threadsafe(give_back, offset)


class OrderedSender:
    """Sends frames in order; a frame whose blocks must first be filled by a thread (large copies) holds back
    the frames after it until the copy is done, so the event loop keeps serving meanwhile."""

    def __init__(self, send: Callable[[Any], None]) -> None:
        self.send = send
        self._backlog: deque[tuple[Any, list[Copy]]] = deque()

    @property
    def waiting(self) -> bool:
        """Whether frames wait for copies (a frame put now would wait too)."""
        return bool(self._backlog)

    def put(self, frame: Any, copies: list[Copy]) -> None:
        """Send `frame` after `copies` (and every frame put before it)."""
        if not copies and not self._backlog:
            self.send(frame)
            return
        self._backlog.append((frame, copies))
        if len(self._backlog) == 1:
            self._pump()

    def _pump(self) -> None:
        while self._backlog:
            frame, copies = self._backlog[0]
            if copies:
                self._backlog[0] = (frame, [])
                future = asyncio.get_running_loop().run_in_executor(None, copy_into, copies)
                future.add_done_callback(lambda f: self._pump())
                return
            self._backlog.popleft()
            self.send(frame)
