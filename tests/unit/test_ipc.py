"""service/ipc: the frames both sides of the process boundary exchange, and the arena allocator."""

from __future__ import annotations

import typing

import msgspec
import pytest

from service.ipc import frames as ipc
from service.ipc.arena import ALIGN, Allocator
from service.ipc.framing import FrameReader


def _payload(frame: bytes) -> bytes:
    (n,) = ipc.HEADER.unpack_from(frame, 0)
    assert n == len(frame) - ipc.HEADER.size  # the length prefix counts the msgpack payload
    return frame[ipc.HEADER.size :]


def test_every_message_type_round_trips_through_a_frame() -> None:
    tensor = ipc.TensorMsg("IN", "FP32", [2, 3], ipc.WHERE_ARENA, offset=4096, nbytes=24)
    shm_out = ipc.TensorMsg("OUT", "", [], ipc.WHERE_SYSTEM_SHM, offset=8, nbytes=16, key="/region")
    request = ipc.RequestMsg(7, "id-1", [tensor], [ipc.OutputSpec("OUT", shm_out)], {"p": 1, "q": "s"}, 1, "seq", 5, 9)
    messages = [
        ipc.Execute(3, [request]),
        ipc.Respond(7, [ipc.TensorMsg("OUT", "FP32", [1], data=b"\x00" * 4)], {"k": True}, final=False),
        ipc.Respond(7, error_code=3, error="bad"),
        ipc.Respond(7, null=True),
        ipc.ExecDone(3, 1, 2, 3, [("x", 10)], executed=False),
        ipc.Release([0, 4096]),
        ipc.Cancel([7]),
        ipc.Unmap(["/region"]),
        ipc.Shutdown(),
        ipc.Failed("no model.py"),
    ]
    for message in messages:
        assert ipc.decode(_payload(ipc.encode(message))) == message


def test_the_decoder_knows_every_message_of_the_union() -> None:
    kinds = typing.get_args(ipc.Message)
    tags = [k.__struct_config__.tag for k in kinds]
    assert len(set(tags)) == len(tags)  # one tag per message type: a frame can only mean one thing
    assert ipc.Execute in kinds and ipc.MetricUpdate in kinds


def test_a_garbled_frame_is_a_decode_error_not_a_wrong_message() -> None:
    with pytest.raises(msgspec.DecodeError):
        ipc.decode(b"\x92\xa5nope!\x01")


def test_frame_reader_splits_reads_and_stays_in_step_when_delivery_fails() -> None:
    got: list[object] = []

    def deliver(message: object) -> None:
        if isinstance(message, ipc.Cancel) and message.rids == [1]:
            raise RuntimeError("handler failed")
        got.append(message)

    reader = FrameReader(ipc.decode, deliver)
    data = ipc.encode(ipc.Cancel([1])) + ipc.encode(ipc.Release([8])) + ipc.encode(ipc.Cancel([2]))
    cut = len(data) - 3  # the last frame arrives in two reads
    with pytest.raises(RuntimeError):
        reader.feed(data[:cut])  # whole frames, decoded straight from the read
    assert got == []
    reader.feed(data[cut:])
    # the frames after the failed one were kept, nothing was delivered twice
    assert got == [ipc.Release([8]), ipc.Cancel([2])]


def test_the_allocator_aligns_reuses_and_coalesces() -> None:
    a = Allocator(8 * ALIGN)
    first = a.alloc(1)
    second = a.alloc(ALIGN + 1)  # rounded up to two alignment units
    third = a.alloc(ALIGN)
    assert (first, second, third) == (0, ALIGN, 3 * ALIGN)
    assert a.alloc(5 * ALIGN) is None  # only 4 units left
    a.free(second)
    a.free(second)  # a double free is ignored
    assert a.alloc(2 * ALIGN) == ALIGN  # first fit reuses the freed block
    a.free(first)
    a.free(ALIGN)
    a.free(third)
    assert a.alloc(8 * ALIGN) == 0  # every block merged back into one
