"""Benchmark: HTTP server libraries for the REST front end, each serving the same trivial infer route.

Candidates (each in its own process on uvloop, pinned to CPU 0; `ab -k` on CPU 1):
- `aiohttp`: aiohttp.web Application + router (the front end's server until this comparison);
- `granian`: Granian's embedded server (Rust, hyper + tokio) running an RSGI app inside our asyncio loop
  (`granian.server.embed.Server`, one runtime thread), needs `pip install granian`;
- `h1`: Trireme's own connection code (service/frontend/http/h1.py: httptools + an asyncio Protocol).
Every candidate decodes the 16-float JSON body with orjson and answers the same small JSON response: what is
left is what the HTTP server itself costs. Per round (candidates in rotating order) and concurrency: requests/s
of `ab -k -n N` and the server's CPU time per request (/proc utime+stime around the run).

Usage: .venv/bin/python tests/bench/bench_http_servers.py [--rounds 3] [--requests 20000]
       [--servers aiohttp granian h1]      (one server: ... --serve NAME PORT)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import uvloop

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_http import ab_rate  # noqa: E402
from tests.bench.servers import free_port, proc_usage, wait_port  # noqa: E402

PATH = "/v2/models/m/infer"
REPLY = orjson.dumps(
    {
        "model_name": "m",
        "model_version": "1",
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}],
    }
)
BODY = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]})


def work(body: bytes) -> bytes:
    orjson.loads(body)
    return REPLY


async def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def infer(request: web.Request) -> web.Response:
        return web.Response(body=work(await request.read()), content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/v2/models/{model}/infer", infer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    await asyncio.Event().wait()


async def serve_granian(port: int) -> None:
    from granian.constants import HTTPModes, Interfaces
    from granian.server.embed import Server

    class App:
        async def __call__(self, scope: Any, proto: Any) -> None:
            proto.response_bytes(200, [("content-type", "application/json")], work(await proto()))

    server = Server(
        App(), address="127.0.0.1", port=port, interface=Interfaces.RSGI, http=HTTPModes.http1, log_enabled=False
    )
    await server.serve()


async def serve_h1(port: int) -> None:
    import socket

    from service.frontend.http.h1 import H1Server
    from service.frontend.http.message import JSON, Request, Response
    from service.frontend.http.routing import Router
    from service.frontend.http.util import read_body

    async def infer(request: Request) -> Response:
        return Response(200, work(await read_body(request, 64 << 20)), JSON)

    router = Router()
    router.add("/v2/models/{model}/infer", infer)

    async def handle(request: Request) -> Response:
        found = router.resolve(request.path)
        assert found is not None
        handler, request.match_info = found
        return await handler(request)  # type: ignore[return-value]

    server = H1Server(handle)
    await server.start(socket.create_server(("127.0.0.1", port), backlog=1024), None)
    await asyncio.Event().wait()


SERVERS = {"aiohttp": serve_aiohttp, "granian": serve_granian, "h1": serve_h1}


def ab(port: int, concurrency: int, n: int, body: Path) -> float:
    return ab_rate(f"http://127.0.0.1:{port}{PATH}", body, concurrency, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--servers", nargs="+", default=list(SERVERS), choices=list(SERVERS))
    ap.add_argument("--serve", nargs=2, metavar=("NAME", "PORT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        uvloop.run(SERVERS[args.serve[0]](int(args.serve[1])))
        return
    body = Path(tempfile.mkdtemp(prefix="bench_http_servers_")) / "body.json"
    body.write_bytes(BODY)
    os.sched_setaffinity(0, {1})  # ab inherits CPU 1
    rows: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        names = args.servers[r % len(args.servers) :] + args.servers[: r % len(args.servers)]
        for name in names:
            port = free_port()
            cmd = ["taskset", "-c", "0", sys.executable, __file__, "--serve", name, str(port)]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_port(port, proc)
                time.sleep(1)
                for c in (1, 8):
                    ab(port, c, 2000, body)  # warm-up
                    before = proc_usage(proc.pid)["cpu_s"]
                    rate = ab(port, c, args.requests, body)
                    cpu_us = (proc_usage(proc.pid)["cpu_s"] - before) * 1e6 / args.requests
                    rows.setdefault((name, c), []).append((rate, cpu_us))
                    print(f"round {r} {name} c={c}: {rate:.0f} req/s, {cpu_us:.1f} µs CPU/request", file=sys.stderr)
            finally:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    print("\n| server | c | requests/s (median) | server CPU µs/request (median) |")
    print("|---|---|---|---|")
    for name in args.servers:
        for c in (1, 8):
            rates, cpus = zip(*rows[(name, c)], strict=True)
            print(f"| {name} | {c} | {statistics.median(rates):.0f} | {statistics.median(cpus):.1f} |")


if __name__ == "__main__":
    main()
