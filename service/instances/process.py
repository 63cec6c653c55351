"""The server side of one worker process: spawn it, feed it batches, route its responses, notice its death."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.errors import ErrorCode, ServiceError
from service.ipc import frames as ipc
from service.ipc.arena import ArenaMap, GrowingArena, ShmPoolExhausted, segment_name
from service.types import InferRequest, InferResponse, OutputTensor, ShmRef

log = logging.getLogger("trireme.workers")

_instance_ids = itertools.count()


@dataclass(slots=True)
class InstanceSpec:
    """Everything needed to (re)start one model instance."""

    backend: str
    model_name: str
    model_version: str
    model_dir: str
    version_dir: str
    config_json: str
    instance_name: str
    instance_kind: str = "CPU"
    device_id: int = 0
    arena_bytes: int = 256 << 20
    arena_growth_bytes: int = 64 << 20
    arena_reserve: bool = False  # posix_fallocate the arenas at start (a full /dev/shm fails the load, never SIGBUS)
    start_timeout_s: float = 120.0
    log_verbose: int = 0
    env: dict[str, str] = field(default_factory=dict)
    in_process: bool = False  # run on a thread of the server (TRIREME_INSTANCE_MODE=in_process)
    inline: bool = False  # in-process, execute() on the server's event loop (in_process_inline)
    # called with every WorkerProcess made from this spec (restarts too), e.g. to add message_handlers (BLS)
    attach: Callable[[WorkerProcess], None] | None = None


@dataclass(slots=True)
class _Inflight:
    request: InferRequest
    arena_offsets: list[int]


DoneCallback = Callable[["WorkerProcess", "ipc.ExecDone | None"], None]


def worker_command() -> list[str]:
    """argv prefix that starts a worker with this interpreter."""
    return [sys.executable, "-m", "service.worker.main"]


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a worker: ours, plus the repo root on PYTHONPATH so `service` imports anywhere."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    if extra:
        env.update(extra)
    return env


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
    )


THREAD_COPY_BYTES = 4 << 20  # inputs this large are copied into the arena by a thread, off the event loop


def _copy_into(copies: list[tuple[memoryview, Any]]) -> None:
    for target, data in copies:
        np.copyto(np.frombuffer(target, np.uint8), np.frombuffer(data, np.uint8))


class _WorkerProtocol(asyncio.Protocol):
    """Parses frames from the worker socket and hands them to the WorkerProcess synchronously."""

    def __init__(self, owner: WorkerProcess) -> None:
        self.owner = owner
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        if not buf:  # the common case: whole frames in one read, decoded from `data` without copying it first
            view = memoryview(data)
            pos, end = 0, len(data)
            while end - pos >= 4:
                (n,) = ipc.HEADER.unpack_from(data, pos)
                if end - pos - 4 < n:
                    break
                message = ipc.decode(view[pos + 4 : pos + 4 + n])
                pos += 4 + n
                self.owner.on_message(message)
            if pos < end:
                buf += view[pos:]
            return
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= 4:
            (n,) = ipc.HEADER.unpack_from(buf, pos)
            if end - pos - 4 < n:
                break
            message = ipc.decode(memoryview(buf)[pos + 4 : pos + 4 + n])
            pos += 4 + n
            self.owner.on_message(message)
        if pos:
            del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.on_connection_lost()


class WorkerProcess:
    """One model instance's subprocess, seen from the server's event loop."""

    def __init__(self, spec: InstanceSpec, on_exit: Callable[[WorkerProcess], None] | None = None) -> None:
        self.spec = spec
        self.on_exit = on_exit
        self.proc: asyncio.subprocess.Process | None = None
        self.transport: asyncio.Transport | None = None
        self.cancel_sock: socket.socket | None = None
        self._reap_task: asyncio.Task[None] | None = None
        self.in_arena: GrowingArena | None = None  # requests in: the server allocates, grows and writes
        self.out_arena: GrowingArena | None = None  # responses out: the worker allocates, the server reads
        self.in_alloc: GrowingArena | None = None
        self.alive = False
        self._rids = itertools.count(1)
        self._batch_ids = itertools.count(1)
        self.inflight: dict[int, _Inflight] = {}
        self.batches: dict[int, tuple[list[int], DoneCallback]] = {}
        self._startup: asyncio.Future[Any] | None = None
        self._closed = asyncio.get_running_loop().create_future()
        self._idle: asyncio.Future[None] | None = None  # set by wait_idle(): resolved when nothing is in flight
        self.retired = ""  # why the instance takes no new work (unload, instance update); "" while serving
        self.uses_bls = False  # set once the instance made a BLS call (the scheduler stops pipelining to it)
        self._deferred: list[tuple[memoryview, Any]] = []  # (arena view, data) copies of the batch being built
        self._backlog: deque[tuple[ipc.Execute, list[tuple[memoryview, Any]]]] = deque()  # frames waiting on copies
        self.bytes_copied = 0  # input payload bytes copied to this worker, arena or inline (zero-copy accounting)
        self.message_handlers: dict[type, Callable[[Any], None]] = {}
        if spec.attach is not None:
            spec.attach(self)

    # ---- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Spawn the worker, send Init, and wait for Ready; raises ServiceError with the load error."""
        spec = self.spec
        loop = asyncio.get_running_loop()
        tag = f"{next(_instance_ids)}"
        growth = spec.arena_growth_bytes
        size, reserve = spec.arena_bytes, spec.arena_reserve
        first = ArenaMap(segment_name(tag + "i"), size, True, reserve)
        try:
            second = ArenaMap(segment_name(tag + "o"), size, True, reserve)
        except BaseException:
            first.unlink()
            first.close()
            raise
        in_arena = self.in_arena = GrowingArena(first, growth)
        out_arena = self.out_arena = GrowingArena(second, growth)
        self.in_alloc = in_arena
        try:
            await self._spawn(loop)
            assert self._startup is not None
            self.send(
                ipc.Init(
                    spec.backend,
                    spec.model_name,
                    spec.model_version,
                    spec.model_dir,
                    spec.version_dir,
                    spec.config_json,
                    spec.instance_name,
                    spec.instance_kind,
                    spec.device_id,
                    in_arena.name,
                    out_arena.name,
                    spec.arena_bytes,
                    spec.log_verbose,
                    growth,
                )
            )
            try:
                reply = await asyncio.wait_for(self._startup, spec.start_timeout_s)
            except TimeoutError:
                raise ServiceError(
                    ErrorCode.UNAVAILABLE,
                    f"model instance '{spec.instance_name}' did not start within {spec.start_timeout_s} s",
                ) from None
            if isinstance(reply, ipc.Failed):
                raise ServiceError(ErrorCode.INTERNAL, reply.message)
        except BaseException:
            await self.kill()
            raise
        finally:
            # both sides have mapped the arenas (or failed): the names can go now
            in_arena.unlink()
            out_arena.unlink()
        self.alive = True

    async def _spawn(self, loop: asyncio.AbstractEventLoop) -> None:
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # Cancel frames get their own socket: a worker thread blocks on it, so a running execute() sees
        # is_cancelled() without anything waking up on the hot path.
        self.cancel_sock, cancel_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.cancel_sock.setblocking(False)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *worker_command(),
                str(child_sock.fileno()),
                str(cancel_child.fileno()),
                pass_fds=(child_sock.fileno(), cancel_child.fileno()),
                env=worker_env(self.spec.env),
                stdin=asyncio.subprocess.DEVNULL,
                # own session: signals sent to the server's process group (Ctrl-C, timeout) must not
                # kill workers behind the server's back; the server stops them, or they exit on EOF
                start_new_session=True,
            )
        finally:
            child_sock.close()
            cancel_child.close()
        self._startup = loop.create_future()
        self.transport, _ = await loop.create_unix_connection(lambda: _WorkerProtocol(self), sock=parent_sock)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the worker to finalize and exit; kill it if it does not within timeout_s."""
        if self.transport is not None and not self.transport.is_closing():
            self.send(ipc.Shutdown())
        if self.proc is not None:
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
            except TimeoutError:
                log.warning("worker %s did not exit in %.0f s; killing it", self.spec.instance_name, timeout_s)
        await self.kill()

    async def kill(self) -> None:
        """Kill the process (if running), close the socket and unmap arenas."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        if self.transport is not None:
            self.transport.close()
        if self.cancel_sock is not None:
            self.cancel_sock.close()
        await asyncio.shield(self._closed) if self.transport is not None else None
        for arena in (self.in_arena, self.out_arena):
            if arena is not None:
                arena.unlink()
                arena.close()
        self.in_arena = self.out_arena = None

    def retire(self, reason: str) -> None:
        """Take no new batches from now on (the instance is being removed); in-flight work still completes.

        A retired worker is not restarted if it dies, and requests it still holds when it is stopped fail
        with `reason` rather than a crash message.
        """
        self.retired = reason
        self.alive = False

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request or batch is in flight on this worker; False on timeout."""
        if not self.inflight and not self.batches:
            return True
        loop = asyncio.get_running_loop()
        if self._idle is None or self._idle.done():
            self._idle = loop.create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._idle), timeout_s)
        except TimeoutError:
            return False
        return True

    def _check_idle(self) -> None:
        if self._idle is not None and not self.inflight and not self.batches and not self._idle.done():
            self._idle.set_result(None)

    @property
    def pid(self) -> int | None:
        """The worker's process id."""
        return self.proc.pid if self.proc is not None else None

    # ---- traffic --------------------------------------------------------------------------------------
    @property
    def exited(self) -> bool:
        """The worker is gone for good (its channel closed): it will never send again."""
        return self._closed.done()

    @property
    def can_send(self) -> bool:
        """Whether the instance is alive and its channel open."""
        return self.alive and self.transport is not None and not self.transport.is_closing()

    def send(self, message: Any) -> None:
        """Write one frame to the worker; nothing when its channel is already closing (the worker died and
        on_connection_lost, which runs next, fails every request in flight, this one included)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(ipc.encode(message))

    def execute(self, batch: list[InferRequest], on_done: DoneCallback) -> None:
        """Send a batch; responses go to each request's on_response; on_done runs when execute returns."""
        batch_id = next(self._batch_ids)
        messages = []
        rids = []
        for req in batch:
            rid = next(self._rids)
            offsets: list[int] = []
            try:
                messages.append(self._request_message(rid, req, offsets))
            except ShmPoolExhausted as e:  # /dev/shm is full: this request fails, the worker goes on
                self._give_back(offsets)
                if req.on_response is not None:
                    error = ServiceError(ErrorCode.INTERNAL, str(e))
                    req.on_response(InferResponse(req.model_name, req.model_version, req.id, error=error))
                continue
            self.inflight[rid] = _Inflight(req, offsets)
            rids.append(rid)
        self.batches[batch_id] = (rids, on_done)
        frame = ipc.Execute(batch_id, messages)
        if self._deferred or self._backlog:
            self._backlog.append((frame, self._deferred))
            self._deferred = []
            if len(self._backlog) == 1:
                self._send_backlog()
        else:
            self.send(frame)
        if batch[0].stamps is not None:
            sent = time.monotonic_ns()
            for req in batch:
                if req.stamps is not None:
                    req.stamps.append(("frame_sent", sent))

    def _give_back(self, offsets: list[int]) -> None:
        if self.in_alloc is not None:
            for off in offsets:
                self.in_alloc.free(off)

    def _send_backlog(self) -> None:
        """Send queued frames in order; a frame with large inputs waits for their copy on a thread (numpy
        releases the GIL while copying, so the event loop keeps serving other clients meanwhile)."""
        while self._backlog:
            frame, copies = self._backlog[0]
            if copies:
                self._backlog[0] = (frame, [])
                future = asyncio.get_running_loop().run_in_executor(None, _copy_into, copies)
                future.add_done_callback(lambda f: self._send_backlog())
                return
            self._backlog.popleft()
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

    def unmap_client_segments(self, keys: list[str]) -> None:
        """Tell the worker to drop its own mappings of these client segments (they were unregistered)."""
        if self.alive and self.transport is not None and not self.transport.is_closing():
            self.send(ipc.Unmap(keys))

    def cancel(self, requests: list[InferRequest]) -> None:
        """Mark running requests cancelled inside the worker (pb_utils is_cancelled())."""
        rids = [rid for rid, rec in self.inflight.items() if rec.request in requests]
        if rids and self.alive and self.cancel_sock is not None:
            with contextlib.suppress(BlockingIOError, OSError):
                self.cancel_sock.send(ipc.encode(ipc.Cancel(rids)))

    def on_message(self, message: Any) -> None:
        """Route one frame from the worker."""
        if isinstance(message, ipc.Respond):
            self._on_respond(message)
        elif isinstance(message, ipc.ExecDone):
            _rids, on_done = self.batches.pop(message.batch_id, ([], None))
            if on_done is not None:
                on_done(self, message)
            if self._idle is not None:
                self._check_idle()
        elif isinstance(message, ipc.Ready | ipc.Failed):
            if self._startup is not None and not self._startup.done():
                self._startup.set_result(message)
        else:
            handler = self.message_handlers.get(type(message))
            if handler is not None:
                handler(message)
            else:
                log.warning("unexpected message %s from worker %s", type(message).__name__, self.spec.instance_name)

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
        if msg.error_code >= 0:
            resp = InferResponse(
                req.model_name, req.model_version, req.id, error=ServiceError(ErrorCode(msg.error_code), msg.error)
            )
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

    def _outputs(self, tensors: list[ipc.TensorMsg]) -> list[OutputTensor]:
        out = []
        release = []
        for t in tensors:
            if t.where == ipc.WHERE_INLINE:
                out.append(OutputTensor(t.name, t.datatype, t.shape, t.data))
            elif t.where == ipc.WHERE_ARENA and t.nbytes >= THREAD_COPY_BYTES:
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
        """A large output as an array over the output arena (no copy on the event loop): its block goes back
        to the worker once the last reference to the array is gone (after the response was serialised)."""
        assert self.out_arena is not None
        array = np.frombuffer(self.out_arena.buffer[offset : offset + nbytes], np.uint8)
        weakref.finalize(array, self._release_soon, asyncio.get_running_loop(), offset)
        return array.data  # keeps the array (and so the block) alive as long as it is referenced

    def _release_soon(self, loop: asyncio.AbstractEventLoop, offset: int) -> None:
        """Hand an output-arena block back to the worker, from whichever thread dropped the last view."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker is gone too
            loop.call_soon_threadsafe(self._release_now, offset)

    def _release_now(self, offset: int) -> None:
        if self.can_send:
            self.send(ipc.Release([offset]))

    def on_connection_lost(self) -> None:
        """The worker exited or crashed: stop using it now; fail its requests once its exit status is known."""
        was_alive = self.alive
        self.alive = False
        if not self._closed.done():
            self._closed.set_result(None)
        if self._startup is not None and not self._startup.done():
            self._startup.set_result(ipc.Failed(f"model instance '{self.spec.instance_name}' exited during start-up"))
        task = asyncio.get_running_loop().create_task(self._reap(was_alive))
        self._reap_task = task  # keep a reference until it is done

    async def _reap(self, was_alive: bool) -> None:
        code = None
        if self.proc is not None:
            try:
                code = await asyncio.wait_for(self.proc.wait(), 2.0)
            except TimeoutError:
                code = None
        error = ServiceError(
            ErrorCode.UNAVAILABLE,
            self.retired
            or f"Stub process '{self.spec.instance_name}' is not healthy: it exited while running the request"
            + (f" (exit status {code})" if code is not None else "")
            + "; the instance is being restarted",
        )
        inflight, self.inflight = self.inflight, {}
        for rec in inflight.values():
            if rec.request.on_response is not None:
                rec.request.on_response(
                    InferResponse(rec.request.model_name, rec.request.model_version, rec.request.id, error=error)
                )
        batches, self.batches = self.batches, {}
        for _rids, on_done in batches.values():
            on_done(self, None)
        self._check_idle()
        if was_alive and self.on_exit is not None:
            self.on_exit(self)
