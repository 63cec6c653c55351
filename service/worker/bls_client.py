"""Worker side of BLS: send a model's InferenceRequest to the server and turn the replies into responses.

A call is an ipc.BlsRequest on the worker's control channel; the server answers with ipc.BlsResponse frames
(one, or many for a decoupled model). The calling thread reads the socket itself while it waits
(WorkerChannel.wait_for), so a call made from inside execute() needs no reader thread. Large output
tensors arrive in the worker's input arena and are handed to the model as numpy views; the block goes back
to the server (ipc.BlsRelease, piggybacked on the next call or sent after the batch) once the model has
dropped every view of it.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np

from service.ipc import frames as ipc
from service.worker.channel import WorkerChannel
from service.worker.pb_utils import triton_python_backend_utils as pb_utils
from shm.tensor import DATATYPE_TO_NUMPY, raw_to_numpy

_FIRST_CONTROL_ID = 2 << 40  # reply ids of model-control calls, apart from metric calls and any other user


class _Call:
    """One BLS call in flight: the replies received so far and the future of the next one."""

    __slots__ = ("lock", "replies", "waiter")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.replies: deque[ipc.BlsResponse] = deque()
        self.waiter: Future[Any] | None = None


class BlsClient:
    """`pb_utils.runtime.bls`: executes BLS requests for the model running in this worker."""

    def __init__(self, channel: WorkerChannel) -> None:
        self.channel = channel
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._calls_lock = threading.Lock()
        self._released: deque[int] = deque()  # input-arena blocks the model dropped (finalizers append here)
        self._control_ids = itertools.count(_FIRST_CONTROL_ID)

    # ---- called by pb_utils ------------------------------------------------------------------------------
    def execute(self, request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
        """Run `request` on its target model: an InferenceResponse, or a ResponseIterator when decoupled."""
        call_id = next(self._ids)
        call = _Call()
        with self._calls_lock:
            self._calls[call_id] = call
        try:
            message = self._request_message(call_id, request, decoupled)
        except Exception as e:
            self._forget(call_id)
            return self._error_response(pb_utils.TritonError.INVALID_ARG, f"BLS request is invalid: {e}", decoupled)
        self.channel.send(message)
        if not decoupled:
            reply = self._next_reply(call_id, call)
            while not reply.final:  # a non-decoupled model sends exactly one response, final
                reply = self._next_reply(call_id, call)
            self._forget(call_id)
            return self._to_response(reply)
        # as Triton's, exec(decoupled=True) returns once the first response is there: async_exec waits for it in
        # the executor, so a model that then iterates with a plain `for` inside its coroutine does not block the
        # instance's event loop (and every other request's coroutine) waiting for it
        first = self._next_reply(call_id, call)
        with call.lock:
            call.replies.appendleft(first)
        return pb_utils.ResponseIterator(self._iterate(call_id, call), lambda: self._cancel(call_id))

    def control(self, message: ipc.ModelControl) -> ipc.ModelControlReply:
        """Send a model-control request (load, unload, readiness) and wait for the server's answer."""
        message.id = next(self._control_ids)
        future: Future[Any] = Future()
        self.channel.pending[message.id] = future
        self.channel.send(message)
        reply: ipc.ModelControlReply = self.channel.wait_for(future)
        return reply

    def on_response(self, message: ipc.BlsResponse) -> None:
        """A reply arrived (called by whichever thread is reading the socket)."""
        with self._calls_lock:
            call = self._calls.get(message.reply_to)
        if call is None:
            self._release_outputs(message)  # the caller went away (cancelled iterator): give blocks back
            return
        with call.lock:
            call.replies.append(message)
            waiter, call.waiter = call.waiter, None
        if waiter is not None:
            waiter.set_result(None)

    def flush(self) -> None:
        """Give back input-arena blocks whose arrays the model dropped (called after each batch)."""
        if not self._released:
            return
        offsets = self._take_released()
        if offsets:
            self.channel.send(ipc.BlsRelease(offsets))

    # ---- internals -----------------------------------------------------------------------------------------
    def _request_message(self, call_id: int, request: pb_utils.InferenceRequest, decoupled: bool) -> ipc.BlsRequest:
        version = request._model_version
        inputs = [self.channel.numpy_to_tensor(t.name(), t.as_numpy(), None) for t in request.inputs()]
        return ipc.BlsRequest(
            call_id,
            request.model_name(),
            "" if version is None or int(version) < 0 else str(version),
            inputs,
            list(request.requested_output_names()),
            request.request_id(),
            dict(request._parameters),
            request.flags(),
            request.correlation_id(),
            request.timeout(),
            decoupled,
            self._take_released(),
            trace_id=request.trace().trace_id,
        )

    def _take_released(self) -> list[int]:
        out = []
        while self._released:
            out.append(self._released.popleft())
        return out

    def _next_reply(self, call_id: int, call: _Call) -> ipc.BlsResponse:
        """Block (reading the socket when nobody else does) until the call has a reply, and pop it."""
        while True:
            with call.lock:
                if call.replies:
                    return call.replies.popleft()
                future: Future[Any] = Future()
                call.waiter = future
            self.channel.wait_for(future)

    def _iterate(self, call_id: int, call: _Call) -> Iterator[pb_utils.InferenceResponse]:
        try:
            while True:
                reply = self._next_reply(call_id, call)
                # the final flags-only reply too, as an empty response: Triton's iterator yields it, and models
                # written for Triton count on it (n responses + 1)
                yield self._to_response(reply)
                if reply.final:
                    return
        finally:
            self._forget(call_id)

    def _cancel(self, call_id: int) -> None:
        with self._calls_lock:
            active = call_id in self._calls
        if active:
            self.channel.send(ipc.BlsCancel(call_id))

    def _forget(self, call_id: int) -> None:
        """The caller is done with the call (finished, or walked away from a cancelled iterator): replies it
        did not read give their arena blocks back, and later replies do so as they arrive (on_response)."""
        with self._calls_lock:
            call = self._calls.pop(call_id, None)
        if call is None:
            return
        with call.lock:
            unread, call.replies = list(call.replies), deque()
        for reply in unread:
            self._release_outputs(reply)

    def _to_response(self, reply: ipc.BlsResponse) -> pb_utils.InferenceResponse:
        if reply.error_code >= 0:
            self._release_outputs(reply)
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(reply.error, reply.error_code), parameters=reply.parameters or None
            )
        tensors = [pb_utils._tensor_from_input(t.name, self._to_numpy(t)) for t in reply.outputs]
        return pb_utils.InferenceResponse(tensors, parameters=reply.parameters or None)

    def _to_numpy(self, t: ipc.TensorMsg) -> np.ndarray:
        """An output as numpy: inline bytes, or a view over the input arena released when the model drops it."""
        if t.where != ipc.WHERE_ARENA:
            return self.channel.tensor_to_numpy(t)
        arena = self.channel.in_arena
        assert arena is not None
        view = arena.buffer[t.offset : t.offset + t.nbytes]
        if t.datatype == "BYTES":
            array = raw_to_numpy(view, t.datatype, t.shape)  # deserialized into new objects
            self._released.append(t.offset)
            return array
        flat = np.frombuffer(view, dtype=DATATYPE_TO_NUMPY[t.datatype])
        # every view numpy derives from `flat` keeps `flat` as its base: the block lives while any of them does
        weakref.finalize(flat, self._released.append, t.offset)
        return flat.reshape(tuple(t.shape))

    def _release_outputs(self, reply: ipc.BlsResponse) -> None:
        for t in reply.outputs:
            if t.where == ipc.WHERE_ARENA:
                self._released.append(t.offset)

    @staticmethod
    def _error_response(code: int, message: str, decoupled: bool) -> Any:
        response = pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
        if decoupled:
            return pb_utils.ResponseIterator(iter([response]))
        return response
