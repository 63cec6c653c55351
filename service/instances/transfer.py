"""Tensors across the process boundary, server side: a request's inputs into frames (inline, input arena, or a
reference to a client's shared-memory region) and a response's outputs back out of the output arena."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from service.instances.spec import InstanceSpec
from service.ipc import frames as ipc
from service.ipc.arena import GrowingArena
from service.ipc.blocks import LEND_BYTES, THREAD_COPY_BYTES, Copy, OrderedSender, lent_view
from service.types import InferRequest, OutputTensor, ShmRef

log = logging.getLogger("trireme.workers")


@dataclass(slots=True)
class _Inflight:
    request: InferRequest
    arena_offsets: list[int]


def shm_tensor_msg(name: str, datatype: str, shape: list[int], ref: ShmRef) -> ipc.TensorMsg:
    """A tensor whose bytes are in a client's registered region: the worker maps the region itself."""
    where = ipc.WHERE_SYSTEM_SHM if ref.kind == "system" else ipc.WHERE_CUDA_SHM
    return ipc.TensorMsg(
        name,
        datatype,
        shape,
        where,
        offset=ref.offset,
        nbytes=ref.byte_size,
        key=ref.key,
        handle=ref.raw_handle,
        device=ref.device_id,
        path=ref.path,
    )


class ArenaTransfer:
    """WorkerProcess's tensor traffic (a mixin: the state is the WorkerProcess's own)."""

    in_arena: GrowingArena | None
    out_arena: GrowingArena | None
    in_alloc: GrowingArena | None
    _deferred: list[Copy]
    frames: OrderedSender
    bytes_copied: int
    spec: InstanceSpec

    @property
    def can_send(self) -> bool:
        raise NotImplementedError

    def send(self, message: Any) -> None:
        raise NotImplementedError

    def _give_back(self, offsets: list[int]) -> None:
        if self.in_alloc is not None:
            for off in offsets:
                self.in_alloc.free(off)

    def _send_waited(self, frame: Any) -> None:
        """A frame that waited for its inputs' copy by a thread (self.frames): the worker may be gone by now."""
        if self.can_send:
            self.send(frame)

    def _request_message(self, rid: int, req: InferRequest, offsets: list[int]) -> ipc.RequestMsg:
        tensors = []
        copied = 0  # input payload bytes this request costs in copies between the server and the worker
        for t in req.inputs:
            if t.shm is not None:
                tensors.append(shm_tensor_msg(t.name, t.datatype, t.shape, t.shm))
                continue
            data = t.data if t.data is not None else b""
            n = len(data)
            copied += n
            if n <= ipc.INLINE_LIMIT:
                tensors.append(ipc.TensorMsg(t.name, t.datatype, t.shape, data=bytes(data)))
                continue
            assert self.in_alloc is not None and self.in_arena is not None
            off = self.in_alloc.alloc(n)  # grows the arena when full
            if n >= THREAD_COPY_BYTES:  # copied by a thread before the frame goes out (see execute)
                self._deferred.append((self.in_arena.buffer[off : off + n], data))
            else:
                self.in_arena.buffer[off : off + n] = data
            offsets.append(off)
            tensors.append(ipc.TensorMsg(t.name, t.datatype, t.shape, ipc.WHERE_ARENA, offset=off, nbytes=n))
        outputs = []
        for o in req.outputs:
            target = None
            if o.shm is not None:
                target = shm_tensor_msg(o.name, "", [], o.shm)
            outputs.append(ipc.OutputSpec(o.name, target))
        self.bytes_copied += copied
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "input copies: model '%s' request '%s': %d bytes copied to the worker, %d bytes read in place "
                "from client shared memory; instance '%s' total %d bytes copied",
                req.model_name,
                req.id,
                copied,
                sum(t.shm.byte_size for t in req.inputs if t.shm is not None),
                self.spec.instance_name,
                self.bytes_copied,
            )
        trace_id = req.trace.id if req.trace is not None else 0
        return ipc.RequestMsg(
            rid, req.id, tensors, outputs, req.parameters, req.flags, req.sequence_id, req.timeout_us, trace_id
        )

    def _outputs(self, tensors: list[ipc.TensorMsg]) -> list[OutputTensor]:
        out = []
        release = []
        for t in tensors:
            if t.where == ipc.WHERE_INLINE:
                out.append(OutputTensor(t.name, t.datatype, t.shape, t.data))
            elif t.where == ipc.WHERE_ARENA and t.nbytes >= LEND_BYTES:
                out.append(OutputTensor(t.name, t.datatype, t.shape, self._arena_output(t.offset, t.nbytes)))
            elif t.where == ipc.WHERE_ARENA:
                assert self.out_arena is not None
                out.append(
                    OutputTensor(
                        t.name,
                        t.datatype,
                        t.shape,
                        bytes(self.out_arena.buffer[t.offset : t.offset + t.nbytes]),
                    )
                )
                release.append(t.offset)
            else:
                out.append(OutputTensor(t.name, t.datatype, t.shape, None))
        if release:
            self.send(ipc.Release(release))
        return out

    def _arena_output(self, offset: int, nbytes: int) -> memoryview:
        """A large output as a view of the output arena (no copy on the event loop; the front end copies it once
        into its response): its block goes back to the worker once the last reference to the view is gone."""
        assert self.out_arena is not None
        return lent_view(self.out_arena.buffer[offset : offset + nbytes], offset, self._release_now)

    def _release_now(self, offset: int) -> None:
        if self.can_send:
            self.send(ipc.Release([offset]))
