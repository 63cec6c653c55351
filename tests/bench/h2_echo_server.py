"""The transport floor on HTTP/2 stacks of our own: tests/bench/echo_server.py's KServe v2 echo (same handlers, same
generated protobuf classes, same responses) served without grpc, on asyncio + uvloop, so that what differs from
the grpc.aio echo is only the HTTP/2 and gRPC framing layer. It answers issue 44 item 1's question: would a
Trireme-owned gRPC server, as Trireme did for HTTP/1.1 on httptools, beat grpc.aio and pygrpc-native per request?

--variant h2: python-hyper's `h2` state machine (the well-tested HTTP/2 implementation; tests/bench/h2echo/lib.py).
--variant own: our own framing with struct and slices, HPACK decoding by the `hpack` library with header blocks
  cached by their raw bytes, pre-encoded response headers and trailers (tests/bench/h2echo/own.py), pure Python
  (compiled modules beside the sources are not loaded).
--variant own_coalesced: `own` writing the answers that finished in one loop iteration with one `write` (a
  call_soon per batch) instead of one `write` each.
--variant own_mypyc: the same modules compiled with mypyc, as Trireme compiles its HTTP/1.1 front end; build them
  first, in place: `.venv/bin/mypyc --ignore-missing-imports tests/bench/h2echo/own.py tests/bench/h2echo/rpc.py`
  (remove with `rm -r build tests/bench/h2echo/*.so *__mypyc.*.so`).
Unary RPCs on cleartext HTTP/2 only: ServerLive/Ready, ServerMetadata, ModelReady, ModelMetadata, ModelConfig,
ModelStatistics (inference_count = ModelInfer calls answered) and ModelInfer, for one unbatched FP32 `[-1]`
identity model of any name; perf_analyzer and tritonclient drive it. Bench-only: `pip install h2` (the `bench`
extra); measured in docs/benchmarks.md ("Issue 44 item 1: own HTTP/2 route, measured").

Usage: python tests/bench/h2_echo_server.py --port PORT --variant h2|own|own_coalesced|own_mypyc
SIGTERM or SIGINT: GOAWAY to every client, then exit once the calls in flight ended (at most 2 s).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.machinery
import signal
import sys
from pathlib import Path
from typing import Any

import uvloop

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.echo_server import Echo  # noqa: E402

VARIANTS = ("h2", "own", "own_mypyc", "own_coalesced")
PACKAGE = "tests.bench.h2echo"


class _SourceOnly:
    """A meta-path finder that imports tests/bench/h2echo's modules from their `.py` files even where mypyc
    modules sit beside them (every variant but own_mypyc)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(PACKAGE + ".") or path is None:
            return None
        loader = (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES)
        for entry in path:
            spec = importlib.machinery.FileFinder(entry, loader).find_spec(fullname)
            if spec is not None:
                return spec
        return None


def protocol_of(variant: str) -> Any:
    """The asyncio Protocol class of a variant (own_mypyc: refuses to run without the compiled modules)."""
    if variant != "own_mypyc":
        sys.meta_path.insert(0, _SourceOnly())
    from tests.bench.h2echo import lib, own, rpc

    if variant == "own_mypyc":
        pure = [m.__name__ for m in (own, rpc) if not m.__file__ or m.__file__.endswith(".py")]
        if pure:
            sys.exit(f"--variant own_mypyc: {', '.join(pure)} not compiled (build command in this script's docstring)")
    own.OwnConnection.coalesce = variant == "own_coalesced"
    return lib.LibConnection if variant == "h2" else own.OwnConnection


async def serve(port: int, variant: str) -> None:
    """Serve on 127.0.0.1:port until SIGTERM/SIGINT, then shut down with GOAWAY."""
    protocol = protocol_of(variant)
    from tests.bench.h2echo import rpc

    loop = asyncio.get_running_loop()
    echo = Echo()
    table = rpc.methods(echo)
    live: set[Any] = set()
    server = await loop.create_server(lambda: protocol(table, live), "127.0.0.1", port, reuse_address=True)
    built = Path(sys.modules[protocol.__module__].__file__ or "").name  # own.py, or own.<abi>.so when compiled
    print(f"Started GRPCInferenceService (echo on HTTP/2 variant {variant}, {built})", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    for conn in list(live):
        conn.shutdown()
    for _ in range(20):
        if not live:
            break
        await asyncio.sleep(0.1)
    misses = getattr(protocol, "cache_misses_total", None)
    extra = f", {misses} header blocks decoded (the rest from the cache)" if misses is not None else ""
    print(f"stopped: {echo.count} ModelInfer calls{extra}", flush=True)


def main() -> None:
    """Parse the flags and run on uvloop."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--variant", choices=VARIANTS, required=True)
    args = ap.parse_args()
    uvloop.run(serve(args.port, args.variant))


if __name__ == "__main__":
    main()
