"""The core process's side of the front-end processes: a Unix-socket server that runs their calls on the Engine.

Each front-end process opens two connections: an asynchronous one (ModelInfer requests, cancellations, the
responses of every request it started, the asynchronous façade calls) and a synchronous one for the façade's
synchronous calls (readiness, metadata, config, statistics, index, shared-memory registry, trace and log
settings, stream submission), which the front end makes blocking: they take tens of microseconds here.
A front end whose connection closes (it exited or was killed) has its in-flight requests cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
from collections.abc import Callable
from typing import Any

from service.core.engine import Engine
from service.ipc.blocks import OrderedSender
from service.ipc.framing import FrameReader
from service.remote.tensors import LinkTensors
from service.remote.tracing import END, CoreTraces, TraceSwitch
from service.remote.wire import forwarded_trace, frame, pack_error, pack_response, unpack_request
from service.types import InferRequest, InferResponse

log = logging.getLogger("trireme.remote")

# the registry methods a front end may call (SharedMemoryRegistry's public surface the front ends use)
SHM_METHODS = frozenset(
    {"register_system", "register_cuda", "unregister_system", "unregister_cuda", "system_status", "cuda_status"}
)
ASYNC_CALLS = frozenset({"load_model", "unload_model", "model_ready"})
_link_ids = itertools.count(1)  # names each connection's output arena


class RemoteHost:
    """Serves the front-end processes of one core process."""

    def __init__(self, engine: Engine, path: str, frontends_up: Callable[[], bool]) -> None:
        self.engine = engine
        self.path = path
        self.frontends_up = frontends_up
        self.conns: dict[int, _Conn] = {}  # front-end id -> its asynchronous connection
        self._server: asyncio.AbstractServer | None = None
        self.on_hello: Callable[[int], None] | None = None
        self.tracing = TraceSwitch()  # the front ends inherit its fd

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.tracing_changed()
        self._server = await loop.create_unix_server(lambda: _Conn(self), self.path)

    def broadcast(self, message: Any) -> None:
        data = frame(message)
        for conn in list(self.conns.values()):
            conn.write(data)

    def tracing_changed(self) -> None:
        """Show the front ends whether the core's tracer is on (they mark requests for it only while it is)."""
        self.tracing.set(self.engine.tracer.enabled)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    # ---- synchronous calls ------------------------------------------------------------------------------
    def call(self, conn: _Conn, method: str, args: tuple) -> Any:
        engine = self.engine
        if method == "server_ready":
            return engine.server_ready() and self.frontends_up()
        if method == "live":
            return engine.live
        if method == "submit":
            rid, packed = args
            target = self.conns.get(conn.frontend_id)
            if target is None:
                raise ConnectionError("the front end's response connection is closed")
            mv = target.start(rid, packed, engine.submit)
            return (mv.streams, mv.decoupled)
        if method == "shm":
            name, shm_args = args
            if name not in SHM_METHODS:
                raise ValueError(f"unknown shared-memory call {name!r}")
            return getattr(engine.client_shm(), name)(*shm_args)
        if method == "client_shm":
            engine.client_shm()  # raises while client shared memory is disabled
            return None
        if method == "log_update":
            engine.log_settings.update(args[0])
            return None
        if method == "log_dict":
            return engine.log_settings.as_dict()
        if method == "trace_setting":
            result = engine.trace_setting(*args)
            self.tracing_changed()
            return result
        if method in (
            "model_metadata",
            "model_config",
            "statistics",
            "repository_index",
            "is_decoupled",
            "model_location",
        ):
            return getattr(engine, method)(*args)
        raise ValueError(f"unknown call {method!r}")


class _Conn(asyncio.Protocol):
    """One connection of a front end (its kind and id come with its first frame)."""

    def __init__(self, host: RemoteHost) -> None:
        self.host = host
        self.frames = FrameReader(pickle.loads, self.on_message)
        self.transport: asyncio.Transport | None = None
        self.kind = ""
        self.frontend_id = 0
        # request id -> [request, model version (None until started)]
        self.inflight: dict[int, list[Any]] = {}
        self.traces = CoreTraces(lambda: host.engine.tracer)
        # large response outputs go through this connection's arena; input blocks the front end lent come back
        self.tensors = LinkTensors(f"fl{next(_link_ids)}", lambda offsets: self.write(frame(("f", offsets))))
        self.responses = OrderedSender(self.write)  # a response whose outputs a thread copies holds back later ones

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def write(self, data: bytes) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(data)

    def data_received(self, data: bytes) -> None:
        self.frames.feed(data)

    def on_message(self, msg: tuple) -> None:
        try:
            self.handle(msg)
        except Exception:
            log.exception("front-end frame %r failed", msg[0] if msg else msg)

    def handle(self, msg: tuple) -> None:
        op = msg[0]
        if op == "i":  # ModelInfer
            _, rid, packed = msg
            try:
                self.start(rid, packed, self.host.engine.start_single)
            except Exception as e:
                self.write(frame(("e", rid, pack_error(e))))
        elif op == "f":  # the front end is done with these output blocks
            self.tensors.free(msg[1])
        elif op == "c":
            entry = self.inflight.get(msg[1])
            if entry is not None and entry[1] is not None:
                self.host.engine.cancel(entry[0], entry[1])
        elif op == "s":  # synchronous call: the front end blocks until the reply
            _, method, args = msg
            try:
                reply: tuple = ("ok", self.host.call(self, method, args))
            except Exception as e:
                reply = ("err", pack_error(e))
            self.write(frame(reply))
        elif op == "a":
            asyncio.get_running_loop().create_task(self._async_call(msg[1], msg[2], msg[3]))
        elif op == END:
            self.traces.end(*msg[1:])
            self.host.tracing_changed()  # sampling may have used up trace_count
        elif op == "hello":
            _, self.kind, self.frontend_id = msg
            if self.kind == "async":
                self.host.conns[self.frontend_id] = self
                if self.host.on_hello is not None:
                    self.host.on_hello(self.frontend_id)

    def start(self, rid: int, packed: tuple, start: Callable[..., Any]) -> Any:
        """Start a request of this front end; its responses go back as ("r", rid, response) frames."""
        tensors = self.tensors
        request: InferRequest = unpack_request(packed, tensors.resolve)
        forwarded = forwarded_trace(packed)
        if forwarded is not None:
            self.traces.begin(rid, request, forwarded)
            self.host.tracing_changed()  # sampling may have used up trace_count
        entry: list[Any] = [request, None]
        inflight = self.inflight
        inflight[rid] = entry
        put = self.responses.put
        place = tensors.place
        # the request holds on_response and on_response would hold the request: dropped on the final response,
        # so the request, and its views of the front end's arena blocks, go as soon as the engine is done with it
        # (left to the garbage collector, the blocks came back late and the front end's arena kept growing)
        owner: InferRequest | None = request

        def on_response(response: InferResponse) -> None:
            nonlocal owner
            packed_response = pack_response(response, place)
            copies = tensors.take_pending()[0] if tensors.pending else []
            if response.final:
                inflight.pop(rid, None)
                req, owner = owner, None
                if req is not None and req.stamps is not None:  # TRIREME_STAGE_TRACE: the core's stages go back
                    # with the answer, after the worker's ExecDone (read with the response) added the worker's
                    stamps = req.stamps
                    traced = req.trace is not None
                    asyncio.get_running_loop().call_soon(
                        lambda: put(frame(("r", rid, packed_response, stamps, traced)), copies)
                    )
                    return
                if forwarded is not None:  # whether the core sampled it: the front end sends tracing.END only if so
                    traced = req is not None and req.trace is not None
                    put(frame(("r", rid, packed_response, None, traced)), copies)
                    return
            put(frame(("r", rid, packed_response)), copies)

        try:
            mv = start(request, on_response)
        except BaseException:
            inflight.pop(rid, None)
            owner = None
            raise
        entry[1] = mv
        return mv

    async def _async_call(self, cid: int, method: str, args: tuple) -> None:
        try:
            if method not in ASYNC_CALLS:
                raise ValueError(f"unknown call {method!r}")
            result = await getattr(self.host.engine, method)(*args)
            reply: tuple = ("a", cid, None, result)
        except Exception as e:
            reply = ("a", cid, pack_error(e), None)
        self.write(frame(reply))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.kind != "async":
            return
        self.traces.close()
        self.tensors.close()
        if self.host.conns.get(self.frontend_id) is self:
            del self.host.conns[self.frontend_id]
        inflight, self.inflight = self.inflight, {}
        for request, mv in inflight.values():  # the front end is gone: nobody waits for these
            if mv is not None:
                try:
                    self.host.engine.cancel(request, mv)
                except Exception:
                    log.exception("cancelling a request of a closed front end failed")
