"""service/remote/tensors.py: large tensors between a front end and the core as blocks of the sender's arena,
given back by the reader only when its last view is gone; small ones and a full /dev/shm ride in the frame."""

from __future__ import annotations

import asyncio
import gc
import pickle

import numpy as np
import pytest

from service.ipc.arena import ShmPoolExhausted
from service.ipc.blocks import copy_into
from service.remote import tensors as link
from service.remote.tensors import LINK_ARENA_BYTES, LinkTensors
from service.remote.wire import pack_request, unpack_request
from service.types import InferRequest, InputTensor


def _request(*arrays: np.ndarray) -> InferRequest:
    return InferRequest(
        "m", "", "id", [InputTensor(f"I{k}", "FP32", [a.size], a.tobytes()) for k, a in enumerate(arrays)], []
    )


def test_blocks_travel_by_reference_and_come_back_when_the_last_view_goes() -> None:
    async def main() -> None:
        returned: list[list[int]] = []
        front = LinkTensors("ut_fe", lambda offsets: None)
        core = LinkTensors("ut_core", returned.append)
        small = np.arange(16, dtype=np.float32)
        big = np.arange(LINK_ARENA_BYTES, dtype=np.float32)  # 4x the threshold, copied now
        huge = np.arange(1 << 20, dtype=np.float32) * 3  # 4 MiB: left for a thread
        try:
            packed = pickle.loads(pickle.dumps(pack_request(_request(small, big, huge), None, front.place)))
            inputs = packed[3]
            assert type(inputs[0][3]) is bytes  # small: inline
            assert type(inputs[1][3]) is tuple and type(inputs[2][3]) is tuple  # references, not bytes
            copies, offsets = front.take_pending()
            assert len(copies) == 1 and len(offsets) == 1  # only the 4 MiB one waits for a thread
            copy_into(copies)
            request = unpack_request(packed, core.resolve)
            assert [np.frombuffer(t.data, np.float32).tolist() for t in request.inputs] == [
                small.tolist(),
                big.tolist(),
                huge.tolist(),
            ]
            kept = np.frombuffer(request.inputs[2].data, np.float32)  # e.g. a model's state
            del request
            gc.collect()
            await asyncio.sleep(0)  # the give-back runs on the loop
            assert sorted(o for batch in returned for o in batch) == [inputs[1][3][1]]  # not the kept one
            for batch in returned:
                front.free(batch)
            again = front.place(big.tobytes())  # the freed block is reused
            assert again[1] == inputs[1][3][1]
            assert kept[:3].tolist() == huge[:3].tolist()  # the kept block was not reused
            del kept
            gc.collect()
            await asyncio.sleep(0)
            assert inputs[2][3][1] in [o for batch in returned for o in batch]
            front.free([inputs[2][3][1], inputs[2][3][1]])  # a second give-back of a block is ignored
        finally:
            core.close()
            front.close()

    asyncio.run(main())


def test_a_full_dev_shm_sends_the_bytes_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise ShmPoolExhausted("full")

    monkeypatch.setattr(link, "ArenaMap", full)
    side = LinkTensors("ut_full", lambda offsets: None)
    data = np.ones(LINK_ARENA_BYTES, np.uint8).tobytes()
    assert side.place(data) == data
    assert side.place(None) is None


def test_typed_and_strided_views_travel_as_their_bytes() -> None:
    async def main() -> None:
        front = LinkTensors("ut_views", lambda offsets: None)
        core = LinkTensors("ut_views_core", lambda offsets: None)
        matrix = np.arange(2 * LINK_ARENA_BYTES, dtype=np.float32).reshape(2, -1)
        try:
            for data in (memoryview(matrix), memoryview(matrix.T)):  # C order, and a transposed (strided) view
                ref = front.place(data)
                assert type(ref) is tuple
                got = core.resolve(ref)
                assert bytes(got) == bytes(data)  # bytes() of a view: its elements in logical (C) order
        finally:
            core.close()
            front.close()

    asyncio.run(main())
