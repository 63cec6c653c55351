"""Server side of BLS: run the requests Python models send (ipc.BlsRequest) through the engine and reply.

A BLS request becomes an ordinary InferRequest submitted with Engine.submit, so it is scheduled, batched
and counted in the target model's statistics like a client request. Replies go back as ipc.BlsResponse;
outputs over ipc.INLINE_LIMIT are written into the calling worker's input arena.

Deadlock rule: a call whose target model has every instance waiting on the caller's own call chain (a model
calling itself, or A -> B -> A, with no free instance left) can never run, so it fails at once with
UNAVAILABLE instead of hanging. Waits that cross unrelated call chains are bounded by the request's
`timeout` (microseconds), after which the caller gets an error response and the nested request is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from service.errors import ErrorCode, ServiceError
from service.instances.process import WorkerProcess
from service.ipc import frames as ipc
from service.ipc.arena import ShmPoolExhausted
from service.types import InferRequest, InferResponse, InputTensor, OutputTensor, RequestedOutput

if TYPE_CHECKING:
    from service.core.engine import Engine
    from service.core.repository.repository import ModelVersion

log = logging.getLogger("trireme.bls")


@dataclass(slots=True, eq=False)
class _Call:
    """One BLS request in flight."""

    worker: WorkerProcess
    call_id: int
    request: InferRequest
    arena_offsets: list[int]  # blocks of the caller's output arena holding the inputs
    mv: ModelVersion | None = None
    timer: asyncio.TimerHandle | None = None
    answered: bool = False  # the caller got its final reply (a timeout may come before the real final)
    chain: frozenset[WorkerProcess] = field(default_factory=frozenset)


class BlsServer:
    """Routes the BLS messages of every worker; `engine` is set once the engine exists."""

    def __init__(self, engine: Engine | None = None) -> None:
        self.engine = engine
        self._calls: dict[tuple[WorkerProcess, int], _Call] = {}
        self._chains: dict[InferRequest, frozenset[WorkerProcess]] = {}

    def attach(self, worker: WorkerProcess) -> None:
        """Install the BLS message handlers on a new worker (RepositoryOptions.attach_worker)."""
        worker.message_handlers[ipc.BlsRequest] = partial(self._on_request, worker)
        worker.message_handlers[ipc.BlsCancel] = partial(self._on_cancel, worker)
        worker.message_handlers[ipc.BlsRelease] = partial(self._on_release, worker)
        worker.message_handlers[ipc.ModelControl] = partial(self._on_control, worker)

    def _on_control(self, worker: WorkerProcess, msg: ipc.ModelControl) -> None:
        """Model control from a model: run it on the engine (as the repository API would) and reply."""
        asyncio.get_running_loop().create_task(self._control(worker, msg))

    async def _control(self, worker: WorkerProcess, msg: ipc.ModelControl) -> None:
        reply = ipc.ModelControlReply(msg.id)
        engine = self.engine
        try:
            if engine is None:
                raise ServiceError(ErrorCode.UNAVAILABLE, "the server is not ready")
            if msg.op == "load":
                await engine.load_model(msg.model_name, msg.config, msg.files or None)
            elif msg.op == "unload":
                await engine.unload_model(msg.model_name, msg.unload_dependents)
            elif msg.op == "ready":
                reply.ready = await engine.model_ready(msg.model_name, msg.model_version)
            else:
                raise ServiceError(ErrorCode.INVALID_ARG, f"unknown model control '{msg.op}'")
        except ServiceError as e:
            reply.error = e.message
        except Exception as e:  # the model gets the message; the server goes on
            log.exception("model control from '%s' failed", worker.spec.instance_name)
            reply.error = str(e)
        try:
            worker.send(reply)
        except Exception:  # the worker is gone: nobody waits for the reply
            log.debug("model control reply to '%s' not sent", worker.spec.instance_name, exc_info=True)

    # ---- messages from workers -------------------------------------------------------------------------
    def _on_request(self, worker: WorkerProcess, msg: ipc.BlsRequest) -> None:
        if msg.release:
            self._on_release(worker, ipc.BlsRelease(msg.release))
        offsets: list[int] = []
        inputs = []
        for t in msg.inputs:
            if t.where == ipc.WHERE_ARENA and worker.out_arena is not None:
                inputs.append(
                    InputTensor(t.name, t.datatype, t.shape, worker.out_arena.buffer[t.offset : t.offset + t.nbytes])
                )
                offsets.append(t.offset)
            else:
                inputs.append(InputTensor(t.name, t.datatype, t.shape, t.data))
        request = InferRequest(
            msg.model_name,
            msg.model_version,
            msg.request_id,
            inputs,
            [RequestedOutput(name) for name in msg.outputs],
            dict(msg.parameters),
            sequence_id=msg.correlation_id,
            flags=msg.flags,
            timeout_us=msg.timeout_us,
        )
        if msg.trace_id and self.engine is not None:
            parent = self.engine.tracer.find(msg.trace_id)  # the model passed trace=request.trace()
            if parent is not None:
                request.trace = parent.child(msg.model_name)
        call = _Call(worker, msg.id, request, offsets)
        self._calls[(worker, msg.id)] = call
        worker.uses_bls = True
        try:
            self._submit(call, msg)
        except ServiceError as e:
            self._reply_error(call, e.code, e.message)
            self._finish(call)

    def _submit(self, call: _Call, msg: ipc.BlsRequest) -> None:
        if self.engine is None:
            raise ServiceError(ErrorCode.UNAVAILABLE, "BLS requests are not accepted: the server is starting")
        request = call.request
        target = self.engine.repository.get(request.model_name, request.model_version)
        if target.decoupled and not msg.decoupled:
            raise ServiceError(
                ErrorCode.INVALID_ARG,
                f"model '{request.model_name}' uses the decoupled transaction policy: call "
                "InferenceRequest.exec(decoupled=True) or async_exec(decoupled=True) and iterate the responses",
            )
        chain = self._chain_of(call.worker)
        pool = target.pool
        if pool is not None and pool.workers and all(w in chain for w in pool.workers):
            raise ServiceError(
                ErrorCode.UNAVAILABLE,
                f"BLS request from model '{call.worker.spec.model_name}' to model '{request.model_name}' would "
                f"deadlock: all {len(pool.workers)} instance(s) of '{request.model_name}' are waiting on this "
                "call chain (a model calling itself, or a cycle of models); add instances in 'instance_group' "
                "or break the cycle",
            )
        call.chain = chain
        self._chains[request] = chain
        request.single_response = not msg.decoupled
        call.mv = self.engine.submit(request, partial(self._on_response, call))
        if msg.timeout_us > 0 and not call.answered:
            loop = asyncio.get_running_loop()
            call.timer = loop.call_later(msg.timeout_us / 1e6, self._on_timeout, call)

    def _chain_of(self, worker: WorkerProcess) -> frozenset[WorkerProcess]:
        """The worker plus every instance waiting (transitively) on the requests it is running."""
        chain = {worker}
        for rec in worker.inflight.values():
            chain.update(self._chains.get(rec.request, ()))
        return frozenset(chain)

    def _on_cancel(self, worker: WorkerProcess, msg: ipc.BlsCancel) -> None:
        call = self._calls.get((worker, msg.id))
        if call is not None and call.mv is not None and self.engine is not None:
            self.engine.cancel(call.request, call.mv)

    def _on_release(self, worker: WorkerProcess, msg: ipc.BlsRelease) -> None:
        if worker.in_alloc is not None:
            for off in msg.offsets:
                worker.in_alloc.free(off)

    # ---- replies -------------------------------------------------------------------------------------------
    def _on_response(self, call: _Call, response: InferResponse) -> None:
        if not call.answered:
            reply = ipc.BlsResponse(call.call_id, final=response.final)
            if response.parameters:
                reply.parameters = response.parameters
            if response.error is not None:
                reply.error_code, reply.error = int(response.error.code), response.error.message
            elif response.null:
                reply.null = True
            else:
                try:
                    reply.outputs = [self._tensor(call.worker, o) for o in response.outputs]
                except ShmPoolExhausted as e:  # /dev/shm is full: the caller gets the error, the worker goes on
                    reply.outputs = []
                    reply.error_code, reply.error = int(ErrorCode.INTERNAL), str(e)
            if response.final:
                call.answered = True
            self._send(call.worker, reply)
        if response.final:
            self._finish(call)

    def _on_timeout(self, call: _Call) -> None:
        call.timer = None
        if call.answered:
            return
        self._reply_error(
            call,
            ErrorCode.UNAVAILABLE,
            f"BLS request to model '{call.request.model_name}' timed out after {call.request.timeout_us} us",
        )
        if call.mv is not None and self.engine is not None:
            self.engine.cancel(call.request, call.mv)

    def _reply_error(self, call: _Call, code: ErrorCode, message: str) -> None:
        call.answered = True
        self._send(call.worker, ipc.BlsResponse(call.call_id, error_code=int(code), error=message))

    def _finish(self, call: _Call) -> None:
        """The nested request is over: give the caller's input blocks back and forget the call."""
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        self._calls.pop((call.worker, call.call_id), None)
        self._chains.pop(call.request, None)
        if call.arena_offsets and call.worker.alive:
            call.worker.send(ipc.Release(call.arena_offsets))
        call.arena_offsets = []

    @staticmethod
    def _send(worker: WorkerProcess, message: Any) -> None:
        if worker.can_send:
            worker.send(message)

    @staticmethod
    def _tensor(worker: WorkerProcess, out: OutputTensor) -> ipc.TensorMsg:
        """An output for the caller: inline when small, else written into the caller's input arena."""
        data = out.data if out.data is not None else b""
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        if n > ipc.INLINE_LIMIT and worker.in_alloc is not None and worker.in_arena is not None:
            off = worker.in_alloc.alloc(n)  # grows the caller's arena when full
            worker.in_arena.buffer[off : off + n] = data
            return ipc.TensorMsg(out.name, out.datatype, out.shape, ipc.WHERE_ARENA, offset=off, nbytes=n)
        return ipc.TensorMsg(out.name, out.datatype, out.shape, data=bytes(data))
