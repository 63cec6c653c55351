"""Frames from a worker, server side: parse them off the channel and route each to where it belongs (responses to
their requests, batch completions to the scheduler, start-up replies, handlers such as BLS)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from mypy_extensions import mypyc_attr

from service.errors import ErrorCode, ServiceError
from service.instances.readiness import ReadinessProbe
from service.instances.spec import InstanceSpec
from service.instances.transfer import _Inflight
from service.ipc import frames as ipc
from service.ipc.arena import GrowingArena
from service.ipc.framing import FrameReader
from service.types import InferResponse, OutputTensor

log = logging.getLogger("trireme.workers")


class _Owner(Protocol):
    def on_message(self, message: Any) -> None: ...
    def on_connection_lost(self) -> None: ...


class _WorkerProtocol(asyncio.Protocol):
    """Parses frames from the worker's pipe and hands them to the WorkerProcess synchronously."""

    def __init__(self, owner: _Owner) -> None:
        self.owner = owner
        self.reader = FrameReader(ipc.decode, owner.on_message)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.on_connection_lost()


# a base of WorkerProcess, an interpreted class, when compiled with mypyc (the one compiled base it may have)
@mypyc_attr(allow_interpreted_subclasses=True)
class FrameDispatch:
    """WorkerProcess's routing of incoming frames (a mixin: the state is the WorkerProcess's own)."""

    inflight: dict[int, _Inflight]
    in_alloc: GrowingArena | None
    batches: dict[int, tuple[list[int], Callable[[Any, ipc.ExecDone | None], None]]]
    message_handlers: dict[type, Callable[[Any], None]]
    _startup: asyncio.Future[Any] | None
    _idle: asyncio.Future[None] | None
    readiness: ReadinessProbe
    spec: InstanceSpec

    def _check_idle(self) -> None:
        raise NotImplementedError

    def _outputs(self, tensors: list[ipc.TensorMsg]) -> list[OutputTensor]:
        raise NotImplementedError

    def on_message(self, message: Any) -> None:
        """Route one frame from the worker."""
        if type(message) is ipc.Respond:
            self._on_respond(message)
            if message.done is not None:  # the batch's ExecDone rode in its last response
                self._on_exec_done(message.done)
        elif isinstance(message, ipc.ExecDone):
            self._on_exec_done(message)
        elif isinstance(message, ipc.ReadyReply):
            self.readiness.on_reply(message)
        elif isinstance(message, ipc.Ready | ipc.Failed):
            if self._startup is not None and not self._startup.done():
                self._startup.set_result(message)
        else:
            handler = self.message_handlers.get(type(message))
            if handler is not None:
                handler(message)
            else:
                log.warning("unexpected message %s from worker %s", type(message).__name__, self.spec.instance_name)

    def _on_reschedule(self, req: Any) -> None:
        """The model released the request for rescheduling: its scheduler takes it back, or (a model that is no
        iterative sequence) it ends with Triton's error."""
        if req.on_reschedule is not None:
            req.on_reschedule(req)
        elif req.on_response is not None:
            message = (
                "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
                "configured to handle such a flag."
            )
            req.on_response(
                InferResponse(
                    req.model_name, req.model_version, req.id, error=ServiceError(ErrorCode.INVALID_ARG, message)
                )
            )
        if self._idle is not None:
            self._check_idle()

    def _on_exec_done(self, message: ipc.ExecDone) -> None:
        _rids, on_done = self.batches.pop(message.batch_id, ([], None))
        if on_done is not None:
            on_done(self, message)
        if self._idle is not None:
            self._check_idle()

    def _on_respond(self, msg: ipc.Respond) -> None:
        rec = self.inflight.get(msg.rid)
        if rec is None:
            return
        req = rec.request
        if req.stamps is not None:
            req.stamps.append(("response_frame", time.monotonic_ns()))
        if msg.final:
            del self.inflight[msg.rid]
            if rec.arena_offsets and self.in_alloc is not None:
                for off in rec.arena_offsets:
                    self.in_alloc.free(off)
            if msg.reschedule:
                self._on_reschedule(req)
                return
        # one constructor call per case (not a default object patched field by field)
        if msg.error_code >= 0:
            resp = InferResponse(
                req.model_name, req.model_version, req.id, error=ServiceError(ErrorCode(msg.error_code), msg.error)
            )
            resp.model_error = msg.model_error  # returned by the model: a success for statistics
        elif msg.null:
            resp = InferResponse(req.model_name, req.model_version, req.id, null=True)
        else:
            resp = InferResponse(req.model_name, req.model_version, req.id, self._outputs(msg.outputs))
        resp.final = msg.final
        if msg.parameters:
            resp.parameters = msg.parameters
        if req.on_response is not None:
            req.on_response(resp)
        if self._idle is not None and msg.final:
            self._check_idle()
