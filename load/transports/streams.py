"""Asynchronous request transports: ModelInfer over HTTP/2 or gRPC futures, or one shared stream matched by id.

Both call `done(end_ns, error, responses, recv_ns)` once per request, on a gRPC or reader thread.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from load.transports.client import request_suffix
from protos import grpc_service_pb2 as pb

now_ns = time.monotonic_ns
parse_unary = pb.ModelInferResponse.FromString
parse_stream = pb.ModelStreamInferResponse.FromString


Done = Callable[[int, "str | None", int, int], None]  # (end_ns, error, responses, recv_ns)


class AsyncTransport:
    """Sends requests without blocking; completions are reported through `done`."""

    def submit(self, body: bytes, done: Done) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release the transport (in-flight requests are abandoned)."""


class UnaryFutures(AsyncTransport):
    """ModelInfer futures; completions run on gRPC's callback thread."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def submit(self, body: bytes, done: Done) -> None:
        def finished(fut: Any) -> None:
            t2 = now_ns()
            err = fut.exception()
            if err is not None:
                done(t2, rpc_message(err), 0, 0)
                return
            parse_unary(fut.result())
            t3 = now_ns()
            done(t3, None, 1, t3 - t2)

        self._call.future(body).add_done_callback(finished)


class SharedStream(AsyncTransport):
    """One ModelStreamInfer stream; responses are matched to requests by request id on a reader thread."""

    def __init__(self, stream_call: Any, decoupled: bool, fail: Callable[[str], None]) -> None:
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._pending: dict[str, tuple[Done, list[int]]] = {}
        self._ids = itertools.count(1)
        self._decoupled = decoupled
        self._fail = fail
        self._responses = stream_call(iter(self._queue.get, None))
        self._reader = threading.Thread(target=self._read, daemon=True, name="load-stream-reader")
        self._reader.start()

    def submit(self, body: bytes, done: Done) -> None:
        rid = str(next(self._ids))
        self._pending[rid] = (done, [0, 0, 0])  # responses, last non-empty end, recv ns
        self._queue.put(body + request_suffix(request_id=rid))

    def _read(self) -> None:
        try:
            for raw in self._responses:
                t2 = now_ns()
                msg = parse_stream(raw)
                t3 = now_ns()
                rid = msg.infer_response.id
                entry = self._pending.get(rid)
                if entry is None:
                    continue
                done, acc = entry
                acc[2] += t3 - t2
                if msg.error_message:
                    del self._pending[rid]
                    done(t3, msg.error_message, 0, acc[2])
                    continue
                final = not self._decoupled or is_final(msg)
                if msg.infer_response.outputs or not final or acc[0] == 0:
                    acc[0], acc[1] = acc[0] + 1, t3
                if final:
                    del self._pending[rid]
                    done(acc[1], None, acc[0], acc[2])
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                self._fail(rpc_message(err))
        for done, _acc in list(self._pending.values()):
            done(now_ns(), "the inference stream ended before the response arrived", 0, 0)
        self._pending.clear()

    def close(self) -> None:
        self._queue.put(None)
        self._reader.join(5.0)
        if self._reader.is_alive():
            self._responses.cancel()
            self._reader.join(5.0)


def is_final(msg: pb.ModelStreamInferResponse) -> bool:
    """Whether a streamed response is its request's last (always, unless decoupled)."""
    param = msg.infer_response.parameters.get("triton_final_response")
    return bool(param.bool_param) if param is not None else True


def rpc_message(err: BaseException) -> str:
    """ "CODE: details" for a gRPC error, else the exception text."""
    if isinstance(err, grpc.RpcError) and hasattr(err, "code"):
        return f"{err.code().name}: {err.details()}"
    return str(err)


class H2Transport(AsyncTransport):
    """Unary ModelInfer over the minimal HTTP/2 client (load/transports/h2.py) on its own event-loop thread."""

    def __init__(self, url: str, grpc_call: Any) -> None:
        from load.transports.h2 import H2Connection, LoopThread

        host, _, port = url.rpartition(":")
        host = host.strip("[]") or "localhost"
        self._grpc_call = grpc_call
        self._closing = False
        self._loop = LoopThread()

        async def connect() -> H2Connection:
            loop = asyncio.get_running_loop()
            path = "/inference.GRPCInferenceService/ModelInfer"
            _t, proto = await loop.create_connection(lambda: H2Connection(url, path, self._on_done), host, int(port))
            return proto

        try:
            self._conn = self._loop.run(connect(), 10.0)
        except (OSError, TimeoutError, ValueError) as err:
            self._loop.stop()
            raise ConnectionError(f"cannot connect to {url}: {err}") from None
        self._thread_id = self._loop.thread_id

    def _on_done(self, ctx: tuple[Done, bytes], message: bytes | None, failure: str) -> None:
        done, body = ctx
        t2 = now_ns()
        if message is None:
            if not self._closing:  # calls cut off by close() were abandoned by the engine already
                done(t2, self._explain(body, failure), 0, 0)
            return
        parse_unary(message)
        t3 = now_ns()
        done(t3, None, 1, t3 - t2)

    def _explain(self, body: bytes, failure: str) -> str:
        """The server's own error text: replay the failed request once through the grpc library."""
        try:
            self._grpc_call(body, timeout=10.0)
        except grpc.RpcError as err:
            return rpc_message(err)
        return f"{failure} (the same request succeeded through the grpc library)"

    def submit(self, body: bytes, done: Done) -> None:
        if threading.get_ident() == self._thread_id:
            self._conn.send(body, (done, body))
        else:
            self._loop.loop.call_soon_threadsafe(self._conn.send, body, (done, body))

    def close(self) -> None:
        self._closing = True
        self._loop.loop.call_soon_threadsafe(self._conn.close)
        self._loop.stop()
