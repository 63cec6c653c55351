"""Entry point of a worker process: load one model instance with its backend and serve batches.

Started by the server as `python -m service.worker.main model=<name> version=<v> instance=<instance>` (words that
only name the process for ps and top) with its descriptors in the environment (ipc/launch.py): the two pipes of
its frame channel (ipc/pipes.py) and the cancel socket; everything else arrives as messages on the channel
(ipc.Init or ipc.AutoComplete first).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from service.errors import ErrorCode
from service.ipc import frames as ipc
from service.ipc import stagetrace
from service.ipc.arena import ShmPoolExhausted
from service.ipc.launch import take_fds, take_placement
from service.ipc.pipes import PipeEnds, PipeStream
from service.worker.backends.base import Backend, BackendContext, WorkerRequest, load_backend_class
from service.worker.bls_client import BlsClient
from service.worker.channel import OutputTooLarge, WorkerChannel
from service.worker.metrics_client import ChannelMetricsSink
from service.worker.pb_utils import metrics as pb_metrics
from service.worker.pb_utils.hooks import runtime as pb_runtime
from service.worker.placement import pin
from shm.system import SegmentTruncated

log = logging.getLogger("trireme.worker")

_NOTHING: frozenset[int] = frozenset()  # no request of the batch was cancelled before it started


class CancelListener:
    """A daemon thread that blocks on the cancel socket and flags cancelled requests while execute() runs."""

    def __init__(self, sock: socket.socket, on_message: Any) -> None:
        self.sock = sock
        self.on_message = on_message
        threading.Thread(target=self._run, name="cancel-listener", daemon=True).start()

    def _run(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 4:
                (n,) = ipc.HEADER.unpack_from(buf, 0)
                if len(buf) < 4 + n:
                    break
                self.on_message(ipc.decode(buf[4 : 4 + n]))
                buf = buf[4 + n :]


class Worker:
    """Holds the backend and turns messages into backend calls and backend answers into messages."""

    def __init__(self, channel: WorkerChannel, init: ipc.Init) -> None:
        self.channel = channel
        self.init = init
        self.config: dict[str, Any] = json.loads(init.config_json)
        self.requests: dict[int, WorkerRequest] = {}
        self.requests_lock = threading.Lock()
        self.cancelled_early: set[int] = set()  # rids cancelled before their batch started
        self.executions: list[ipc.Execute] = []
        self.backend: Backend | None = None
        # implicit state outputs are outputs too; a set: looked up per response
        self.output_names = frozenset(
            [o["name"] for o in self.config.get("output", [])]
            + [s["output_name"] for s in self.config.get("sequence_batching", {}).get("state", [])]
        )
        self.running = True
        self.bls = BlsClient(channel)  # pb_utils.runtime.bls: requests from this model to others
        self.thread_init: Any = None  # BackendContext.thread_init (set by in-process instances)
        self.metrics = ChannelMetricsSink(channel)  # pb_utils.MetricFamily / Metric
        pb_metrics.state.local.sink = self.metrics  # this thread's (an in-process instance has one per thread)
        # replies (metric calls, BLS) may be awaited from initialize(), before serve() starts
        channel.on_message = self.on_message

    def start(self) -> None:
        """Map arenas, create and initialize the backend, and report Ready or Failed."""
        init = self.init
        try:
            self.channel.map_arenas(init.in_arena, init.out_arena, init.arena_growth_bytes)
            force_cpu = self.config.get("parameters", {}).get("FORCE_CPU_ONLY_INPUT_TENSORS", {})
            self.channel.gpu_inputs = str(force_cpu.get("string_value", "yes")).lower() == "no"
            backend_cls = load_backend_class(init.backend, init.backend_dir)
            context = BackendContext(
                model_name=init.model_name,
                model_version=init.model_version,
                model_dir=init.model_dir,
                version_dir=init.version_dir,
                config=self.config,
                config_json=init.config_json,
                instance_name=init.instance_name,
                instance_kind=init.instance_kind,
                device_id=init.device_id,
                bls=self.bls,
                thread_init=self.thread_init,
            )
            self.backend = backend_cls(context)
            self.backend.initialize()
            self.channel.gpu_inputs = self.channel.gpu_inputs or self.backend.device_inputs
        except BaseException as e:
            self.channel.send(ipc.Failed(_describe(e)))
            raise SystemExit(1) from None
        self.channel.send(ipc.Ready(ready_fn=self.backend.has_ready_fn))

    def _check_ready(self, check_id: int) -> None:
        """Run the model's readiness check on a thread of its own (it may be slow, and this is the side
        socket's reader or the server's loop) and answer with ReadyReply."""

        def run() -> None:
            if self.thread_init is not None:
                self.thread_init()
            backend = self.backend
            ready = backend is not None and backend.is_ready()
            self.channel.send(ipc.ReadyReply(check_id, ready))

        threading.Thread(target=run, name="ready-check", daemon=True).start()

    def on_message(self, message: Any) -> None:
        """Dispatch one message that is not a reply someone waits for."""
        if isinstance(message, ipc.Execute):
            self.executions.append(message)
        elif isinstance(message, ipc.Release):
            self.channel.release(message.offsets)
        elif isinstance(message, ipc.Cancel):
            with self.requests_lock:
                for rid in message.rids:
                    req = self.requests.get(rid)
                    if req is not None:
                        req.cancelled = True
                    else:  # not started yet (pipelined behind the running batch): never run it
                        self.cancelled_early.add(rid)
        elif isinstance(message, ipc.Unmap):
            self.channel.client_segments.drop(message.keys)
        elif isinstance(message, ipc.ReadyCheck):
            self._check_ready(message.check_id)
        elif isinstance(message, ipc.BlsResponse):
            self.bls.on_response(message)
        elif isinstance(message, ipc.Shutdown):
            self.running = False
        else:
            reply = getattr(message, "reply_to", None)
            fut = self.channel.pending.pop(reply, None) if reply is not None else None
            if fut is not None:
                fut.set_result(message)

    def serve(self) -> None:
        """The main loop: read, execute batches in arrival order, until Shutdown or EOF."""
        self.channel.on_message = self.on_message
        while self.running:
            if not self.executions:
                message = self.channel.read_one_unless(self.executions)
                if message is not None:
                    self.on_message(message)
                continue
            self.run_batch(self.executions.pop(0))
        if self.backend is not None:
            self.backend.finalize()
        self.metrics.close()

    def run_batch(self, ex: ipc.Execute) -> None:
        """Materialize a batch, call the backend, report completion."""
        assert self.backend is not None
        tracing = stagetrace.RECORDER is not None
        w0 = time.monotonic_ns() if tracing else 0
        t0 = time.perf_counter_ns()
        batch: list[WorkerRequest] = []
        skip: AbstractSet[int] = _NOTHING
        if self.cancelled_early:
            with self.requests_lock:
                skip, last = self.cancelled_early, ex.requests[-1].rid if ex.requests else 0
                self.cancelled_early = {rid for rid in skip if rid > last}
            for r in ex.requests:
                if r.rid in skip:
                    self._send_error(r.rid, ErrorCode.CANCELLED, "request cancelled by the client")
        to_numpy = self.channel.tensor_to_numpy
        respond = self.respond
        for r in ex.requests:
            if r.rid in skip:
                continue
            inputs = {}
            try:
                for t in r.inputs:  # plain loops, not comprehensions: one function object less each, per request
                    inputs[t.name] = to_numpy(t)
            except Exception as e:
                self._send_error(r.rid, ErrorCode.INVALID_ARG, str(e))
                continue
            names, specs = [], {}
            for o in r.outputs:
                names.append(o.name)
                specs[o.name] = o.shm
            # positional: keyword arguments cost a dict per call; `extra` built in one literal
            extra: dict[str, Any] = {"out_specs": specs}
            if r.trace_id:
                extra["trace_id"] = r.trace_id
            args = (r.rid, r.id, inputs, names, r.parameters, r.flags, r.correlation_id, r.timeout_us, respond)
            batch.append(WorkerRequest(*args, False, 0, False, False, extra))
        with self.requests_lock:
            for req in batch:
                self.requests[req.rid] = req
        t1 = time.perf_counter_ns()
        w1 = time.monotonic_ns() if tracing else 0
        # non-decoupled responses all come during execute: send them with ExecDone in one write
        corked = not self.backend.decoupled
        if corked:
            self.channel.cork()
        try:
            if batch:
                self.backend.execute(batch)
        except BaseException as e:
            message = f"Failed to process the request(s) for model '{self.init.instance_name}', message: {_describe(e)}"
            log.error("%s", message)
            for req in batch:
                if not req.closed:
                    req.fail(ErrorCode.INTERNAL, message)
        t2 = time.perf_counter_ns()
        w2 = time.monotonic_ns() if tracing else 0
        if not self.backend.decoupled:
            for req in batch:
                if not req.closed and not req.deferred:
                    req.fail(ErrorCode.INTERNAL, "model returned no response for the request")
        self.bls.flush()
        self.metrics.flush()
        done = ipc.ExecDone(ex.batch_id, t1 - t0, t2 - t1, 0)
        if not batch and skip:
            done.executed = False
        if tracing:
            w3 = time.monotonic_ns()
            done.stamps = [("worker_start", w0), ("execute_start", w1), ("execute_end", w2), ("worker_send", w3)]
        if corked:
            self.channel.uncork(done)
        else:
            self.channel.send(done)

    def respond(
        self,
        req: WorkerRequest,
        outputs: dict[str, np.ndarray] | None,
        error: tuple[int, str] | None,
        final: bool,
        parameters: dict[str, Any] | None,
        model_error: bool = False,
    ) -> None:
        """Send one response for `req` (the backend calls this through req.respond)."""
        if req.closed:
            raise RuntimeError("Unable to send response. Response sender has been closed.")
        encoded: list[ipc.TensorMsg] = []
        code, text, null = -1, "", False
        if error is not None:
            code, text = error
        elif outputs is None:
            null = True
        else:
            try:
                encoded = self._encode_outputs(req, outputs)
            except (OutputTooLarge, ShmPoolExhausted) as e:
                code, text = int(ErrorCode.INTERNAL), str(e)
            except SegmentTruncated as e:  # the client truncated its output region: its error, not ours
                code, text = int(ErrorCode.INVALID_ARG), str(e)
            except (ValueError, TypeError) as e:
                code, text = int(ErrorCode.INTERNAL), str(e)
        # one positional constructor call (keywords and field-by-field updates cost more, per response)
        msg = ipc.Respond(
            req.rid, encoded, parameters or {}, code, text, final, null, model_error and error is not None
        )
        if null and req.rescheduled:
            msg.reschedule = True
        req.responses_sent += 1
        if final:
            req.closed = True
            with self.requests_lock:
                self.requests.pop(req.rid, None)
        self.channel.send(msg)

    def _encode_outputs(self, req: WorkerRequest, outputs: dict[str, np.ndarray]) -> list[ipc.TensorMsg]:
        wanted = req.requested_outputs
        specs: dict[str, ipc.TensorMsg | None] = req.extra["out_specs"]
        known = self.output_names
        encoded = []
        for name, array in outputs.items():
            if known and name not in known:
                raise ValueError(f"unexpected inference output '{name}' for model '{self.init.model_name}'")
            if wanted and name not in wanted:
                continue  # produced but not requested: dropped, as Triton does
            if type(array) is not np.ndarray:
                array = np.asarray(array)
            encoded.append(self.channel.numpy_to_tensor(name, array, specs.get(name)))
        return encoded

    def _send_error(self, rid: int, code: ErrorCode, message: str) -> None:
        self.channel.send(ipc.Respond(rid, error_code=int(code), error=message))


def _describe(e: BaseException) -> str:
    """'ExcType: message' as Triton's python backend reports exceptions."""
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def run_auto_complete(channel: WorkerChannel, msg: ipc.AutoComplete) -> None:
    """Run the backend's auto_complete and send back the completed JSON config."""
    try:
        backend_cls = load_backend_class(msg.backend, msg.backend_dir)
        config = backend_cls.auto_complete(json.loads(msg.config_json), msg.model_dir, msg.version_dir)
        channel.send(ipc.Ready(json.dumps(config)))
    except BaseException as e:
        channel.send(ipc.Failed(_describe(e)))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("auto-complete failed:\n%s", traceback.format_exc())


def main() -> None:
    """Talk to the server through the inherited pipes and serve until told to stop."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(process)d %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when workers stop
    fds, placement = take_fds(), take_placement()
    # what a model sees in sys.argv, as under Triton's stub: no worker arguments (unittest.main() and argparse
    # in a model.py parse an empty command line)
    sys.argv = [""]
    if len(fds) < 2:
        raise SystemExit("a worker needs its channel's two pipe descriptors")
    channel = WorkerChannel(PipeStream(PipeEnds(fds[0], fds[1])))
    try:
        first = channel.read_one()
        if isinstance(first, ipc.AutoComplete):
            run_auto_complete(channel, first)
            return
        if not isinstance(first, ipc.Init):
            raise SystemExit(f"unexpected first message {type(first).__name__}")
        if first.log_verbose:
            logging.getLogger().setLevel(logging.DEBUG)
        try:
            pin(*placement)  # the host policy: before the model allocates anything
        except OSError as e:
            channel.send(ipc.Failed(f"model instance '{first.instance_name}': {e.strerror}"))
            return
        worker = Worker(channel, first)
        # pb_utils.Logger lines go to the server, which logs them under its current settings
        pb_runtime.log = lambda level, message, file, line: channel.send(ipc.ModelLog(level, message, file, line))
        pb_metrics.state.default = worker.metrics  # threads the model starts itself use it too
        if len(fds) > 2:
            CancelListener(socket.socket(fileno=fds[2]), worker.on_message)
        worker.start()
        worker.serve()
    except (EOFError, ConnectionError, BrokenPipeError):
        pass  # the server went away: exit quietly
    finally:
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
