"""Instructions per request of the HTTP front end's own path, in one process and without sockets: noise-free, ~1 min.

The real HttpFrontend (service/frontend/http: h1.py's connection, the routes, the infer handler, the codec) serves
a stand-in engine whose `infer` answers the identity of the request's input one loop callback later (as the real
engine's future is resolved from the worker's frame), on a uvloop loop. Each request is the bytes perf_analyzer
2.51 sends (`-i http`, 16 floats, binary data both ways), fed to the connection's `data_received` in one piece
(`--split`: the head and the body in two pieces, as libcurl often sends them); the loop runs until the answer is
written to the stand-in transport. What is left out: the sockets, the core (prepare, scheduling, statistics) and
the worker hop (bench_cpu.py --protocol http measures those).

The script runs itself twice under `valgrind --tool=callgrind` (PYTHONHASHSEED=0) with --low and --high requests
and prints (Ir(high) - Ir(low)) / (high - low): start-up cancels out.

Usage: .venv/bin/python tests/bench/bench_http_ir.py [--low 5000] [--high 25000] [--split]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import callgrind_total  # noqa: E402

HEAD = (
    b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: libcurl-agent/1.0\r\n"
    b"Accept: */*\r\nInference-Header-Content-Length: 171\r\nContent-Type: application/octet-stream\r\n"
    b"Content-Length: 235\r\n\r\n"
)
BODY = (
    b'{"id":"","inputs":[{"name":"INPUT0","datatype":"FP32","shape":[16],"parameters":{"binary_data_size":64}}],'
    b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}' + bytes(range(64))
)


class _Transport:
    """What the connection writes to; resolves `written` on each answer."""

    def __init__(self) -> None:
        self.written: asyncio.Future[None] | None = None

    def write(self, data: bytes) -> None:
        if self.written is not None and not self.written.done():
            self.written.set_result(None)

    def writelines(self, data: list[bytes]) -> None:
        self.write(b"")

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class _Tracer:
    enabled = False


class _Engine:
    """The part of the façade the infer route uses: an identity model answered one callback later."""

    tracer = _Tracer()

    async def infer(self, request: Any) -> Any:
        from service.types import InferResponse, OutputTensor

        loop = asyncio.get_running_loop()
        future = loop.create_future()
        t = request.inputs[0]
        out = InferResponse(request.model_name, "1", request.id, [OutputTensor("OUTPUT0", t.datatype, t.shape, t.data)])
        loop.call_soon(future.set_result, out)
        return await future

    def is_decoupled(self, name: str, version: str = "") -> bool:
        return False


def serve(requests: int, split: bool) -> None:
    """Run `requests` requests through one connection (the measured body)."""
    import uvloop

    from service.frontend.http.h1 import H1Server, _Connection
    from service.frontend.http.server import HttpFrontend, HttpOptions

    async def run() -> None:
        frontend = HttpFrontend(_Engine(), HttpOptions())  # type: ignore[arg-type]
        conn = _Connection(H1Server(frontend.handle))
        transport = _Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        whole = HEAD + BODY
        for _ in range(requests):
            transport.written = loop.create_future()
            if split:
                conn.data_received(HEAD)
                await asyncio.sleep(0)
                conn.data_received(BODY)
            else:
                conn.data_received(whole)
            await transport.written

    uvloop.run(run())


def instructions(requests: int, split: bool) -> int:
    """Ir of one run of this script under callgrind with `requests` requests."""
    return callgrind_total([__file__, "--serve", str(requests), *(["--split"] if split else [])])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--low", type=int, default=5000)
    ap.add_argument("--high", type=int, default=25000)
    ap.add_argument("--split", action="store_true", help="head and body in two pieces")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        serve(args.serve, args.split)
        return
    low, high = instructions(args.low, args.split), instructions(args.high, args.split)
    what = "head and body apart" if args.split else "one piece"
    print(f"HTTP front end ({what}): {(high - low) / (args.high - args.low) / 1e3:.1f}k instructions per request")


if __name__ == "__main__":
    main()
