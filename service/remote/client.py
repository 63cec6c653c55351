"""RemoteEngine: the Engine façade of a front-end process, answered by the core process (service/remote/host.py).

The front-end modules (service/frontend/grpc, service/frontend/http) take it where they take an Engine: one code
path. ModelInfer requests and their cancellation are asynchronous frames; the façade's synchronous calls are
blocking round trips on a second connection (the core answers them at once, from its event loop)."""

from __future__ import annotations

import asyncio
import itertools
import pickle
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protos import model_config_pb2 as mc
from service.core.engine import EXTENSIONS, SERVER_NAME, IndexEntry, ModelMetadata
from service.core.observability.log_settings import LogValue
from service.core.observability.stats import ModelStats
from service.ipc.blocks import copy_into
from service.ipc.framing import FrameReader
from service.remote.tensors import LinkTensors
from service.remote.tracing import ForwardedTrace, RemoteTracer, TraceSwitch
from service.remote.wire import HEADER, frame, pack_request, unpack_error, unpack_response
from service.types import InferRequest, InferResponse, ResponseCallback


@dataclass(slots=True)
class RemoteVersion:
    """What the front ends read of the ModelVersion a submitted request went to; `rid` names it to the core."""

    rid: int
    streams: bool
    decoupled: bool


class _SyncChannel:
    """A blocking connection for the façade's synchronous calls (one call at a time)."""

    def __init__(self, path: str, frontend_id: int) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.lock = threading.Lock()
        self.sock.sendall(frame(("hello", "sync", frontend_id)))

    def _read(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(left)
            if not chunk:
                raise ConnectionError("the core process closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def call(self, method: str, *args: Any) -> Any:
        with self.lock:
            self.sock.sendall(frame(("s", method, args)))
            (n,) = HEADER.unpack(self._read(4))
            status, value = pickle.loads(self._read(n))
        if status == "err":
            raise unpack_error(value)
        return value


class _ShmRegistry:
    """The core's client shared-memory registry, as the front ends call it."""

    def __init__(self, sync: _SyncChannel) -> None:
        self._sync = sync

    def __getattr__(self, name: str) -> Callable[..., Any]:
        sync = self._sync
        return lambda *args: sync.call("shm", name, args)


class _LogSettings:
    """The core's log settings (update and read)."""

    def __init__(self, sync: _SyncChannel) -> None:
        self._sync = sync

    def update(self, changes: dict[str, LogValue]) -> None:
        self._sync.call("log_update", changes)

    def as_dict(self) -> dict[str, LogValue]:
        return dict(self._sync.call("log_dict"))


class _Responses(asyncio.Protocol):
    """The asynchronous connection: routes response frames to the request that waits for them."""

    def __init__(self, engine: RemoteEngine) -> None:
        self.engine = engine
        self.frames = FrameReader(pickle.loads, self.on_message)

    def data_received(self, data: bytes) -> None:
        self.frames.feed(data)

    def on_message(self, msg: tuple) -> None:
        waiting = self.engine.waiting
        op = msg[0]
        if op == "r":
            response = unpack_response(msg[2], self.engine.tensors.resolve)
            if len(msg) > 3:  # a final response of an observed request
                observed = self.engine.observed.pop(msg[1], None)
                if observed is not None:
                    if msg[3] is not None and observed.stamps is not None:
                        observed.stamps.extend(msg[3])  # the core's stage timestamps (TRIREME_STAGE_TRACE)
                    if isinstance(observed.trace, ForwardedTrace):
                        observed.trace.sampled = msg[4]  # whether the core traces it (service/remote/tracing.py)
            target = waiting.pop(msg[1], None) if response.final else waiting.get(msg[1])
            if isinstance(target, asyncio.Future):
                if not target.done():
                    target.set_result(response)
            elif target is not None:
                target(response)
        elif op == "e" or op == "a":
            target = waiting.pop(msg[1], None)
            if isinstance(target, asyncio.Future) and not target.done():
                err = msg[2]
                if err is not None:
                    target.set_exception(unpack_error(err))
                else:
                    target.set_result(msg[3])
        elif op == "f":  # the core is done with these input blocks
            self.engine.tensors.free(msg[1])
        elif op == "drain":
            self.engine.on_drain()

    def connection_lost(self, exc: Exception | None) -> None:
        self.engine.on_core_lost()


def _forwarded(request: InferRequest, rid: int) -> tuple | None:
    """What a traced request takes to the core (service/remote/tracing.py)."""
    trace = request.trace
    return trace.forwarded(rid) if isinstance(trace, ForwardedTrace) else None


class RemoteEngine:
    """The façade surface the gRPC and HTTP front ends use, served by the core process."""

    def __init__(
        self, path: str, frontend_id: int, model_control_mode: str, allow_client_shm: bool, trace_fd: int
    ) -> None:
        self.path = path
        self.frontend_id = frontend_id
        self.model_control_mode = model_control_mode
        self._allow_client_shm = allow_client_shm
        self.tracer = RemoteTracer(self._send, TraceSwitch(trace_fd))  # stamps here, samples and writes in the core
        self.waiting: dict[int, asyncio.Future[Any] | ResponseCallback] = {}
        # requests with stage timestamps (TRIREME_STAGE_TRACE) or a forwarded trace, by id
        self.observed: dict[int, InferRequest] = {}
        self._ids = itertools.count(1)
        self._transport: asyncio.Transport | None = None
        self._sync: _SyncChannel | None = None
        self.on_drain: Callable[[], None] = lambda: None
        self.on_core_lost: Callable[[], None] = lambda: None
        # large request inputs go to the core through this front end's arena (service/remote/tensors.py)
        self.tensors = LinkTensors(f"fe{frontend_id}", self._give_back)

    async def connect(self) -> None:
        """Open both connections to the core (the core counts this front end as up after hello())."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)  # connected first: uvloop does not take abstract socket names
        sock.setblocking(False)
        self._transport, _ = await loop.create_unix_connection(lambda: _Responses(self), sock=sock)  # type: ignore[assignment]
        self._sync = _SyncChannel(self.path, self.frontend_id)
        self.log_settings = _LogSettings(self._sync)
        self.shm_registry = _ShmRegistry(self._sync) if self._allow_client_shm else None

    def hello(self) -> None:
        """Tell the core this front end listens on its ports."""
        self._send(("hello", "async", self.frontend_id))

    def _send(self, message: Any) -> None:
        t = self._transport
        if t is None or t.is_closing():
            raise ConnectionError("the core process closed the connection")
        t.write(frame(message))

    def _give_back(self, offsets: list[int]) -> None:
        t = self._transport
        if t is not None and not t.is_closing():  # else the core is gone, and its arenas with it
            t.write(frame(("f", offsets)))

    def close(self) -> None:
        """Remove this front end's arena (on exit)."""
        self.tensors.close()

    def _call(self, method: str, *args: Any) -> Any:
        assert self._sync is not None
        return self._sync.call(method, *args)

    async def _async_call(self, method: str, *args: Any) -> Any:
        cid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[cid] = future
        self._send(("a", cid, method, args))
        return await future

    # ---- health, metadata, statistics -------------------------------------------------------------------
    @property
    def live(self) -> bool:
        return bool(self._call("live"))

    def server_ready(self) -> bool:
        return bool(self._call("server_ready"))

    def server_metadata(self) -> tuple[str, str, list[str]]:
        from service import __version__

        return SERVER_NAME, __version__, list(EXTENSIONS)

    async def model_ready(self, name: str, version: str = "") -> bool:
        return bool(await self._async_call("model_ready", name, version))

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        result: ModelMetadata = self._call("model_metadata", name, version)
        return result

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        result: mc.ModelConfig = self._call("model_config", name, version)
        return result

    def is_decoupled(self, name: str, version: str = "") -> bool:
        return bool(self._call("is_decoupled", name, version))

    def model_location(self, name: str, version: str = "") -> tuple[str, int]:
        result: tuple[str, int] = self._call("model_location", name, version)
        return result

    def statistics(self, name: str = "", version: str = "") -> list[tuple[str, str, ModelStats]]:
        result: list[tuple[str, str, ModelStats]] = self._call("statistics", name, version)
        return result

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        result: list[IndexEntry] = self._call("repository_index", ready_only)
        return result

    def trace_setting(self, model_name: str = "", updates: dict[str, list[str] | None] | None = None) -> dict:
        result: dict = self._call("trace_setting", model_name, updates)
        return result

    def client_shm(self) -> Any:
        assert self._sync is not None
        self._sync.call("client_shm")  # raises the core's UNSUPPORTED while --allow-client-shm is false
        return _ShmRegistry(self._sync)

    # ---- model control ----------------------------------------------------------------------------------
    async def load_model(self, name: str, config_json: str = "") -> None:
        await self._async_call("load_model", name, config_json)

    async def unload_model(self, name: str) -> None:
        await self._async_call("unload_model", name)

    # ---- inference ----------------------------------------------------------------------------------------
    async def infer(self, request: InferRequest) -> InferResponse:
        rid = next(self._ids)
        future: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = future
        observed = request.stamps is not None or request.trace is not None
        if observed:
            self.observed[rid] = request
        tensors = self.tensors
        packed = pack_request(request, _forwarded(request, rid), tensors.place)
        if tensors.pending:  # large inputs: a thread copies them into the arena before the request goes
            copies, offsets = tensors.take_pending()
            job = asyncio.get_running_loop().run_in_executor(None, copy_into, copies)
            try:
                await asyncio.shield(job)
            except asyncio.CancelledError:  # nothing was sent: the blocks are free once the thread is done
                self.waiting.pop(rid, None)
                self.observed.pop(rid, None)
                job.add_done_callback(lambda _: tensors.free(offsets))
                raise
        self._send(("i", rid, packed))
        try:
            return await future
        except asyncio.CancelledError:
            request.cancelled = True
            if self.waiting.pop(rid, None) is not None:
                self._send(("c", rid))
            raise
        finally:
            if observed:
                self.observed.pop(rid, None)

    def submit(self, request: InferRequest, on_response: ResponseCallback) -> RemoteVersion:
        rid = next(self._ids)
        self.waiting[rid] = on_response
        if request.trace is not None:
            self.observed[rid] = request
        tensors = self.tensors
        try:
            packed = pack_request(request, _forwarded(request, rid), tensors.place)
            if tensors.pending:  # a stream's large inputs: copied here (submit is synchronous)
                copy_into(tensors.take_pending()[0])
            streams, decoupled = self._call("submit", rid, packed)
        except BaseException:
            self.waiting.pop(rid, None)
            self.observed.pop(rid, None)
            raise
        return RemoteVersion(rid, streams, decoupled)

    def cancel(self, request: InferRequest, mv: Any) -> None:
        request.cancelled = True
        self.observed.pop(mv.rid, None)
        if self.waiting.pop(mv.rid, None) is not None:
            self._send(("c", mv.rid))
