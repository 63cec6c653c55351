"""The worker channel's pipes on the server's event loop (uvloop, and asyncio's own loop that unit tests use):
frames both ways, the worker's end seen as EOF, and each descriptor closed exactly once."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from service.ipc.pipes import PipeStream, _PipeFile, open_pipes, pipe_pair

RUNNERS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {"uvloop": uvloop.run, "asyncio": asyncio.run}


class _Collect(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.arrived = asyncio.Event()
        self.lost = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.arrived.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(exc)


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


@pytest.mark.parametrize("loop", list(RUNNERS))
def test_frames_both_ways_then_the_workers_exit_is_eof_and_every_descriptor_closes(loop: str) -> None:
    server, worker_ends = pipe_pair()
    worker = PipeStream(worker_ends)

    async def main() -> None:
        protocol = _Collect()
        writer, reader = await open_pipes(asyncio.get_running_loop(), server, protocol)
        writer.write(b"execute")
        assert os.read(worker.read_fd, 100) == b"execute"
        worker.sendall(b"respond")
        await asyncio.wait_for(protocol.arrived.wait(), 10)
        assert bytes(protocol.data) == b"respond"
        worker.close()  # the worker exits
        await asyncio.wait_for(protocol.lost, 10)
        writer.close()
        reader.close()
        await asyncio.sleep(0.05)  # the transports close on the next loop iterations

    RUNNERS[loop](main())
    assert _closed(server.read_fd) and _closed(server.write_fd)


def test_closing_the_file_leaves_a_descriptor_that_reused_its_number_alone() -> None:
    r, w = os.pipe()
    file = _PipeFile(r)
    os.close(r)  # what uvloop does before it closes the file object
    other_r, other_w = os.pipe()  # the lowest free numbers: `r` again
    try:
        assert other_r == r
        file.close()
        assert not _closed(other_r)
    finally:
        for fd in (w, other_r, other_w):
            os.close(fd)
