"""The server side of one worker process: start and stop it, feed it batches, and the state its other jobs share.

The other jobs live beside it: spawn.py (command line, environment, channel), transfer.py (tensors into and out
of frames and arenas), dispatch.py (routing frames from the worker), crash.py (a worker that dies).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

from service.errors import ErrorCode, ServiceError
from service.instances.crash import CrashHandling
from service.instances.dispatch import FrameDispatch, _WorkerProtocol
from service.instances.readiness import ReadinessProbe
from service.instances.spawn import spawn_worker
from service.instances.spec import InstanceSpec
from service.instances.transfer import ArenaTransfer, _Inflight
from service.ipc import frames as ipc
from service.ipc.arena import ArenaMap, GrowingArena, ShmPoolExhausted, segment_name
from service.ipc.blocks import OrderedSender
from service.ipc.pipes import open_pipes
from service.types import InferRequest, InferResponse

log = logging.getLogger("trireme.workers")

_instance_ids = itertools.count()

DoneCallback = Callable[["WorkerProcess", "ipc.ExecDone | None"], None]


class WorkerProcess(ArenaTransfer, FrameDispatch, CrashHandling):
    """One model instance's subprocess, seen from the server's event loop."""

    def __init__(self, spec: InstanceSpec, on_exit: Callable[[WorkerProcess], None] | None = None) -> None:
        self.spec = spec
        self.on_exit = on_exit
        self.proc: asyncio.subprocess.Process | None = None
        self.transport: asyncio.WriteTransport | None = None  # frames to the worker (a pipe)
        self.receiver: asyncio.ReadTransport | None = None  # frames from the worker (a pipe): its EOF is the exit
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
        self.frames = OrderedSender(self._send_waited)  # frames waiting on their inputs' copies by a thread
        self.bytes_copied = 0  # input payload bytes copied to this worker, arena or inline (zero-copy accounting)
        self.message_handlers: dict[type, Callable[[Any], None]] = {}
        self.readiness = ReadinessProbe(self.send_side, spec.instance_name)  # the model's own is_model_ready()
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
                    spec.backend_dir,
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
            self.readiness.has_fn = reply.ready_fn
        except BaseException:
            await self.kill()
            raise
        finally:
            # both sides have mapped the arenas (or failed): the names can go now
            in_arena.unlink()
            out_arena.unlink()
        self.alive = True

    async def _spawn(self, loop: asyncio.AbstractEventLoop) -> None:
        spec = self.spec
        title = {"model": spec.model_name, "version": spec.model_version, "instance": spec.instance_name}
        self.proc, ends, self.cancel_sock = await spawn_worker(spec.env, title, spec.python)
        self._startup = loop.create_future()
        self.transport, self.receiver = await open_pipes(loop, ends, _WorkerProtocol(self))

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
        """Kill the process (if running), close the channel and unmap arenas."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        self.close_channel()
        if self.cancel_sock is not None:
            self.cancel_sock.close()
        await asyncio.shield(self._closed) if self.transport is not None else None
        for arena in (self.in_arena, self.out_arena):
            if arena is not None:
                arena.unlink()
                arena.close()
        self.in_arena = self.out_arena = None

    def close_channel(self) -> None:
        """Close both pipes of the channel (the receiving one's connection_lost() then runs once)."""
        if self.transport is not None:
            self.transport.close()
        if self.receiver is not None:
            self.receiver.close()

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
        if self._deferred or self.frames.waiting:
            self.frames.put(frame, self._deferred)
            self._deferred = []
        else:
            self.send(frame)
        if batch[0].stamps is not None:
            sent = time.monotonic_ns()
            for req in batch:
                if req.stamps is not None:
                    req.stamps.append(("frame_sent", sent))

    def unmap_client_segments(self, keys: list[str]) -> None:
        """Tell the worker to drop its own mappings of these client segments (they were unregistered)."""
        if self.alive and self.transport is not None and not self.transport.is_closing():
            self.send(ipc.Unmap(keys))

    def cancel(self, requests: list[InferRequest]) -> None:
        """Mark running requests cancelled inside the worker (pb_utils is_cancelled())."""
        rids = [rid for rid, rec in self.inflight.items() if rec.request in requests]
        if rids:
            with contextlib.suppress(ConnectionError):  # not running: nothing to flag
                self.send_side(ipc.Cancel(rids))

    def send_side(self, message: Any) -> None:
        """A message the worker handles at once, even while execute() runs (its side socket's reader thread)."""
        if not self.alive or self.cancel_sock is None:
            raise ConnectionError(f"model instance '{self.spec.instance_name}' is not running")
        with contextlib.suppress(BlockingIOError, OSError):
            self.cancel_sock.send(ipc.encode(message))

    async def check_ready(self) -> bool:
        """Alive, and the model's own readiness check (if it has one) says ready."""
        return self.alive and await self.readiness.check()
