"""Benchmark: the OpenAI API over a decoupled Python model, with and without dynamic batching.

One Trireme server (--openai-port) serves three copies of the mock_llm example: `nobatch` (no dynamic batching:
one request per execute, generated to its end), `static` (dynamic batching, max_batch_size 64: one execute
generates the requests that arrived together to their end) and `inflight` (dynamic batching, and execute hands
its requests to the model's generation loop, where they join the sequences already running at the next step).
Each decoding step sleeps --step seconds once for all sequences it advances, as a GPU step costs about the same
for 1 or 32 sequences. At each
concurrency, that many clients each send --requests streamed chat completions one after another (closed loop,
--tokens tokens each) over plain HTTP (aiohttp, SSE parsed by hand to keep the client cheap); reported: output
tokens/s over the level's wall time, and time to first token (first content chunk), median and p90.

Usage: .venv/bin/python tests/bench/bench_openai.py [--concurrency 1 8 32] [--requests 3] [--tokens 32]
       [--step 0.01]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import free_port, start_trireme, stop, wait_started  # noqa: E402

EXAMPLE = ROOT / "service" / "example_models" / "mock_llm"


VARIANTS = {"nobatch": "no batching", "static": "dynamic batching", "inflight": "dynamic + in-flight batching"}


def write_repo(repo: Path, step: float) -> None:
    """The three variants of mock_llm, `step` seconds per decoding step."""
    for name in VARIANTS:
        shutil.copytree(EXAMPLE, repo / name)
        config = (repo / name / "config.pbtxt").read_text().replace('"0.01"', f'"{step}"')
        config = config.replace('name: "mock_llm"', f'name: "{name}"')
        config = config.replace('"true"', '"true"' if name == "inflight" else '"false"')
        if name == "nobatch":
            config = config.replace("dynamic_batching { max_queue_delay_microseconds: 1000 }", "")
            config = config.replace("max_batch_size: 64", "max_batch_size: 0").replace("dims: [ 1 ]", "dims: [ 1, 1 ]")
            config = config.replace("dims: [ -1 ]", "dims: [ 1, -1 ]")
        (repo / name / "config.pbtxt").write_text(config)


async def one_request(
    session: aiohttp.ClientSession, url: str, model: str, prompt: str, tokens: int
) -> tuple[float, int]:
    """(seconds to the first content chunk, content chunks) of one streamed chat completion."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True, "max_tokens": tokens}
    start = time.perf_counter()
    first = 0.0
    chunks = 0
    async with session.post(url, json=body) as response:
        response.raise_for_status()
        buffer = b""
        async for data in response.content.iter_any():
            buffer += data
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                payload = event.removeprefix(b"data: ")
                if payload == b"[DONE]":
                    continue
                choices = json.loads(payload).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    chunks += 1
                    if not first:
                        first = time.perf_counter() - start
    return first, chunks


async def level(url: str, model: str, concurrency: int, requests: int, tokens: int) -> dict[str, float]:
    """Tokens/s and TTFT percentiles at one concurrency."""
    prompt = " ".join(f"w{i}" for i in range(tokens + 4))  # long enough that every request runs to max_tokens
    ttfts: list[float] = []
    produced = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal produced
        for _ in range(requests):
            ttft, chunks = await one_request(session, url, model, prompt, tokens)
            ttfts.append(ttft)
            produced += chunks

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        await one_request(session, url, model, prompt, 2)  # warm the connection and the model
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    ttfts.sort()
    return {
        "tokens_per_s": produced / wall,
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "ttft_p90_ms": 1000 * ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))],
        "requests": len(ttfts),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=3, help="requests per client at each level")
    ap.add_argument("--tokens", type=int, default=32, help="max_tokens of each request")
    ap.add_argument("--step", type=float, default=0.01, help="seconds per decoding step of the mock model")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        write_repo(repo, args.step)
        openai_port, log = free_port(), Path(tmp) / "server.log"
        proc = start_trireme(repo, free_port(), log, extra_args=["--openai-port", str(openai_port)])
        try:
            wait_started(proc, log)
            url = f"http://127.0.0.1:{openai_port}/v1/chat/completions"
            print(f"mock_llm: {args.step * 1000:g} ms per decoding step, {args.tokens} tokens per request, "
                  f"{args.requests} requests per client")  # fmt: skip
            print()
            print("| concurrency | model | tokens/s | TTFT p50 (ms) | TTFT p90 (ms) | requests |")
            print("|---:|---|---:|---:|---:|---:|")
            for concurrency in args.concurrency:
                for model, label in VARIANTS.items():
                    r = asyncio.run(level(url, model, concurrency, args.requests, args.tokens))
                    print(f"| {concurrency} | {label} | {r['tokens_per_s']:.0f} | {r['ttft_p50_ms']:.1f} | "
                          f"{r['ttft_p90_ms']:.1f} | {r['requests']:.0f} |", flush=True)  # fmt: skip
        finally:
            stop([proc])


if __name__ == "__main__":
    main()
