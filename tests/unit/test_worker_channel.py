"""The worker's buffered frame reader over its pipes: frames split across reads, several frames in one read, frames
larger than the buffer and than a pipe holds, both ways, and EOF."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from service.ipc import frames as ipc
from service.ipc.pipes import PipeStream, pipe_pair
from service.worker.channel import WorkerChannel


@pytest.fixture
def pair() -> Iterator[tuple[PipeStream, WorkerChannel]]:
    """(the server's end, a WorkerChannel on the worker's end: the two pipes the server spawns a worker with)."""
    server_ends, worker_ends = pipe_pair()
    server, worker = PipeStream(server_ends), PipeStream(worker_ends)
    yield server, WorkerChannel(worker)
    server.close()  # (once: a test may have closed it already)
    worker.close()


def test_several_frames_in_one_write_are_read_one_by_one(pair: tuple[PipeStream, WorkerChannel]) -> None:
    server, channel = pair
    server.sendall(ipc.encode(ipc.Release([1])) + ipc.encode(ipc.Cancel([2, 3])) + ipc.encode(ipc.Shutdown()))
    assert channel.read_one() == ipc.Release([1])
    assert channel.read_one() == ipc.Cancel([2, 3])
    assert isinstance(channel.read_one(), ipc.Shutdown)


def test_a_frame_split_across_writes_and_one_larger_than_the_buffer(pair: tuple[PipeStream, WorkerChannel]) -> None:
    server, channel = pair
    big = ipc.Execute(7, [ipc.RequestMsg(1, "r", [ipc.TensorMsg("IN", "UINT8", [200_000], data=bytes(200_000))], [])])
    frame = ipc.encode(ipc.Release([5])) + ipc.encode(big)

    def dribble() -> None:  # header bytes, then the rest in uneven pieces
        for i in range(0, len(frame), 3 if len(frame) < 10 else 70_001):
            server.sendall(frame[i : i + 70_001])

    writer = threading.Thread(target=dribble)
    writer.start()
    assert channel.read_one() == ipc.Release([5])
    got = channel.read_one()
    writer.join()
    assert got.batch_id == 7 and got.requests[0].inputs[0].data == bytes(200_000)


def test_eof_raises(pair: tuple[PipeStream, WorkerChannel]) -> None:
    server, channel = pair
    server.sendall(ipc.encode(ipc.Release([1]))[:3])
    server.close()
    with pytest.raises(EOFError):
        channel.read_one()


def test_a_frame_larger_than_a_pipe_holds_reaches_the_server_whole(pair: tuple[PipeStream, WorkerChannel]) -> None:
    server, channel = pair
    frames = WorkerChannel(server)  # the server's end, read the way the worker reads
    big = ipc.Respond(3, outputs=[ipc.TensorMsg("OUT", "UINT8", [3 << 20], data=bytes(range(256)) * (3 << 12))])
    writer = threading.Thread(target=channel.send, args=(big,))  # blocks until the reader drains the pipe
    writer.start()
    got = frames.read_one()
    writer.join()
    assert got.rid == 3 and got.outputs[0].data == bytes(range(256)) * (3 << 12)
