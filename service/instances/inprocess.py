"""In-process model instances: the worker's code runs on a thread of the server process, with no process hop.

Opt-in per model with the config parameter TRIREME_INSTANCE_MODE = "in_process" (docs/performance.md).
`InProcessInstance` is a WorkerProcess whose "socket" is a pair of in-memory queues: the server hands the
thread the same ipc messages as a worker process gets (as objects, never encoded), and the unchanged
worker_main.Worker on that thread answers with the same messages, delivered on the event loop by
call_soon_threadsafe (a batch's responses and ExecDone in one hand-off). Tensor bytes are never copied: inputs
reach the model as numpy views of the request's bytes (or of the client's shared-memory segment), outputs come
back as views of the model's arrays. There is no crash isolation: a segfault or os._exit in the model ends the
server, a hung execute() hangs its instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sys
import threading
from typing import Any

import numpy as np

from service.errors import ErrorCode, ServiceError
from service.instances.mode import MODE_KEY
from service.instances.process import InstanceSpec, WorkerProcess
from service.instances.transfer import shm_tensor_msg
from service.ipc import frames as ipc
from service.types import InferRequest
from service.worker.channel import WorkerChannel
from service.worker.main import Worker
from service.worker.pb_utils import metrics as pb_metrics
from service.worker.pb_utils import triton_python_backend_utils as pb_utils
from shm.tensor import numpy_to_datatype, numpy_to_raw

log = logging.getLogger("trireme.workers")

SWITCH_INTERVAL_S = 0.0002  # GIL switch interval of a server that runs in-process instances


class _BlsRouter:
    """pb_utils.runtime.bls for the server process: each in-process instance thread reaches its own BlsClient."""

    def __init__(self) -> None:
        self.local = threading.local()

    def __getattr__(self, name: str) -> Any:
        client = getattr(self.local, "client", None)
        if client is None:
            raise pb_utils.TritonModelException(
                "BLS calls are not supported from this thread of an in-process instance: with "
                f"{MODE_KEY}=in_process they work from execute() (and async_exec), not from threads the model "
                "starts itself; in_process_inline runs execute() on the server's event loop, which a BLS call "
                "would block, so it has no BLS (use in_process or worker processes)"
            )
        return getattr(client, name)


BLS_ROUTER = _BlsRouter()  # stateless apart from per-thread slots


class InProcessChannel(WorkerChannel):
    """The worker side of an in-process instance: messages in through a queue, out through the event loop."""

    def __init__(self, owner: InProcessInstance, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(None)  # type: ignore[arg-type] # no socket
        self.owner = owner
        self.loop = loop
        self.loop_thread = threading.get_ident()  # built on the loop's thread
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._held: list[Any] | None = None

    def recv(self) -> Any:
        """Block for the next message from the server."""
        return self.inbox.get()

    def send(self, message: Any) -> None:
        """Hand a message to the server's loop (responses are held while corked)."""
        with self._send_lock:
            if self._held is not None and type(message) is ipc.Respond:
                self._held.append(message)
                return
        self._post([message])

    def cork(self) -> None:
        """Hold responses until uncork()."""
        with self._send_lock:
            self._held = []

    def uncork(self, last: Any = None) -> None:
        """Deliver the held responses (and `last`) in one hand-off."""
        with self._send_lock:
            held, self._held = self._held or [], None
        if last is not None:
            held = ipc.with_done(held, last)
        if held:
            self._post(held)

    def _post(self, messages: list[Any]) -> None:
        with contextlib.suppress(RuntimeError):  # RuntimeError: the loop is closed, the server is gone
            if threading.get_ident() == self.loop_thread:  # inline execution: no wake-up needed
                self.loop.call_soon(self.owner.deliver, messages)
            else:
                self.loop.call_soon_threadsafe(self.owner.deliver, messages)

    def map_arenas(self, in_name: str, out_name: str, growth_bytes: int = 0) -> None:
        """No arenas: tensors are passed by reference."""

    def numpy_to_tensor(self, name: str, array: np.ndarray, target: ipc.TensorMsg | None) -> ipc.TensorMsg:
        """Outputs for a client region are written there; others travel as a view of the model's array."""
        if target is not None:
            return super().numpy_to_tensor(name, array, target)
        return ipc.TensorMsg(name, numpy_to_datatype(array.dtype), list(array.shape), data=numpy_to_raw(array))  # type: ignore[arg-type]


class InProcessInstance(WorkerProcess):
    """One model instance on a thread of the server process (same interface as a worker process)."""

    def __init__(self, spec: InstanceSpec, on_exit: Any = None) -> None:
        super().__init__(spec, on_exit)
        self.channel: InProcessChannel | None = None
        self._thread: threading.Thread | None = None
        self._worker: Worker | None = None
        self._exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def pid(self) -> int | None:
        """No process of its own."""
        return None

    @property
    def exited(self) -> bool:
        """The instance thread has ended."""
        return self._exited.done()

    @property
    def can_send(self) -> bool:
        """Whether the instance thread is alive."""
        return self.alive and not self._exited.done()

    async def start(self) -> None:
        """Start the thread, load the model on it and wait for Ready."""
        spec = self.spec
        loop = asyncio.get_running_loop()
        self.channel = InProcessChannel(self, loop)
        self._startup = loop.create_future()
        init = ipc.Init(
            spec.backend, spec.model_name, spec.model_version, spec.model_dir, spec.version_dir, spec.config_json,
            spec.instance_name, spec.instance_kind, spec.device_id, "", "", 0, spec.log_verbose,
        )  # fmt: skip
        self._thread = threading.Thread(target=self._run, args=(init,), name=spec.instance_name, daemon=True)
        # Python's default GIL switch interval (5 ms) is what a waiting thread can wait for the GIL while the
        # event loop or gRPC's poller holds it: measured here, the hop then cost ~3 ms instead of ~0.1 ms
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread.start()
        try:
            reply = await asyncio.wait_for(asyncio.shield(self._startup), spec.start_timeout_s)
        except TimeoutError:
            raise ServiceError(
                ErrorCode.UNAVAILABLE,
                f"model instance '{spec.instance_name}' did not start within {spec.start_timeout_s} s",
            ) from None
        if isinstance(reply, ipc.Failed):
            raise ServiceError(ErrorCode.INTERNAL, reply.message)
        self.readiness.has_fn = reply.ready_fn
        self.alive = True

    def _run(self, init: ipc.Init) -> None:
        """The instance thread: Worker.start (load) then Worker.serve (batches) until Shutdown."""
        assert self.channel is not None
        try:
            worker = self._worker = Worker(self.channel, init)

            def adopt() -> None:  # this thread, and every thread the backend starts, calls BLS as this instance
                BLS_ROUTER.local.client = worker.bls
                pb_metrics.state.local.sink = worker.metrics  # and creates pb_utils metrics as this instance

            adopt()
            worker.thread_init = adopt
            worker.start()
            pb_utils.runtime.bls = BLS_ROUTER  # the backend set its own client; route by thread instead
            if self.spec.inline:
                return  # loaded: batches run on the event loop (send), this thread's work is done
            worker.serve()
        except SystemExit:
            pass  # Worker.start reported Failed
        except BaseException:
            log.exception("in-process instance '%s' stopped", init.instance_name)
        finally:
            if not (self.spec.inline and self._worker is not None and self._worker.backend is not None):
                self.channel._post([_Exited()])

    def deliver(self, messages: list[Any]) -> None:
        """On the loop: route messages from the instance thread."""
        for message in messages:
            if type(message) is _Exited:
                self._on_thread_exit()
            else:
                self.on_message(message)

    def _on_thread_exit(self) -> None:
        if not self._exited.done():
            self._exited.set_result(None)
        if self.alive or (self._startup is not None and not self._startup.done()):
            self.on_connection_lost()  # fails its requests; the pool restarts it

    def send(self, message: Any) -> None:
        """Hand a message to the instance thread (inline: run it here, on the event loop)."""
        assert self.channel is not None
        if self.spec.inline and self._worker is not None and self.alive:
            if type(message) is ipc.Execute:
                self._worker.run_batch(message)  # its answers reach deliver() through loop.call_soon
            elif type(message) is not ipc.Shutdown:
                self._worker.on_message(message)
            return
        self.channel.inbox.put(message)

    def _request_message(self, rid: int, req: InferRequest, offsets: list[int]) -> ipc.RequestMsg:
        tensors = []
        for t in req.inputs:
            if t.shm is not None:
                tensors.append(shm_tensor_msg(t.name, t.datatype, t.shape, t.shm))
            else:  # the request's own bytes, by reference
                data: Any = t.data if t.data is not None else b""
                tensors.append(ipc.TensorMsg(t.name, t.datatype, t.shape, data=data))
        outputs = [
            ipc.OutputSpec(o.name, shm_tensor_msg(o.name, "", [], o.shm) if o.shm is not None else None)
            for o in req.outputs
        ]
        return ipc.RequestMsg(rid, req.id, tensors, outputs, req.parameters, req.flags, req.sequence_id, req.timeout_us)

    def send_side(self, message: Any) -> None:
        """Handled now, even while the thread is inside execute() (the thread's Worker locks what it shares)."""
        if self._worker is None:
            raise ConnectionError(f"model instance '{self.spec.instance_name}' is not running")
        self._worker.on_message(message)

    def unmap_client_segments(self, keys: list[str]) -> None:
        """Drop the instance's mappings of unregistered client segments."""
        if self.channel is not None:
            self.channel.client_segments.drop(keys)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the thread to finalize the model and end; a thread stuck in the model is left behind."""
        if self.spec.inline and self._worker is not None and self._worker.backend is not None:
            if not self._exited.done():
                self.alive = False
                await asyncio.get_running_loop().run_in_executor(None, self._worker.backend.finalize)
                self._exited.set_result(None)
        elif self.channel is not None and not self._exited.done():
            self.send(ipc.Shutdown())
            try:
                await asyncio.wait_for(asyncio.shield(self._exited), timeout_s)
            except TimeoutError:
                log.warning("in-process instance %s did not stop in %.0f s", self.spec.instance_name, timeout_s)
        await self.kill()

    async def kill(self) -> None:
        """Stop using the instance (a thread cannot be killed: it is asked to stop)."""
        self.alive = False
        if self.channel is not None and not self._exited.done():
            self.send(ipc.Shutdown())
        if not self._closed.done():
            self._closed.set_result(None)


class _Exited:
    """Marker the instance thread posts when it ends."""
