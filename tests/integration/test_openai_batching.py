"""Dynamic batching behind the OpenAI API, and cancellation of a stream whose client goes away."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import requests

from tests.conftest import ServerProcess
from tests.integration.openai_models import openai_server

openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install openai)")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    with openai_server(tmp_path_factory.mktemp("openai"), models=("mock_llm", "mock_llm_inflight", "my_llm")) as s:
        yield s


def _batch_sizes(server: ServerProcess, model: str) -> dict[int, int]:
    """{batch size: executions} from the KServe statistics extension (the same server, its HTTP port)."""
    stats = requests.get(f"http://{server.http_url}/v2/models/{model}/stats", timeout=10).json()
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["model_stats"][0]["batch_stats"]}


@pytest.mark.parametrize("model", ["mock_llm", "mock_llm_inflight"])
def test_concurrent_streams_share_executions(server: tuple[ServerProcess, str], model: str) -> None:
    prompts = [" ".join(f"r{i}w{k}" for k in range(20)) for i in range(8)]

    async def one(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, int]:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], stream=True, max_tokens=100
        )
        parts = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
        return "".join(parts), len(parts)

    async def run() -> list[tuple[str, int]]:
        client = openai.AsyncOpenAI(base_url=server[1] + "/v1", api_key="unused", max_retries=0)
        try:
            return await asyncio.gather(*(one(client, p) for p in prompts))
        finally:
            await client.close()

    results = asyncio.run(run())
    for prompt, (text, chunks) in zip(prompts, results, strict=True):
        assert text == f"user: {prompt}\nassistant:"  # each stream got its own tokens, in order
        assert chunks == 22  # one chunk per word: streamed, not sent at the end
    sizes = _batch_sizes(server[0], model)
    assert sum(size * n for size, n in sizes.items()) == 8
    assert max(sizes) > 1, f"the model never saw a batch: {sizes}"


def test_client_disconnect_cancels_the_request_in_the_model(server: tuple[ServerProcess, str]) -> None:
    client = openai.OpenAI(base_url=server[1] + "/v1", api_key="unused", max_retries=0)
    long_prompt = " ".join(f"w{k}" for k in range(4000))  # 4000 steps of 5 ms: 20 s unless cancelled
    with client.chat.completions.create(
        model="mock_llm", messages=[{"role": "user", "content": long_prompt}], stream=True, max_tokens=4000
    ) as stream:
        got = 0
        for chunk in stream:
            got += bool(chunk.choices and chunk.choices[0].delta.content)
            if got == 3:
                break
    # the model runs one execute at a time: the next request starts only once the cancelled one stopped
    start = time.monotonic()
    out = client.chat.completions.create(model="mock_llm", messages=[{"role": "user", "content": "after"}])
    assert out.choices[0].message.content == "user: after\nassistant:"
    assert time.monotonic() - start < 5.0, "the abandoned stream kept the model busy: it was not cancelled"
    # the same for a request that is not streamed: the client times out, the request is cancelled
    slow = openai.OpenAI(base_url=server[1] + "/v1", api_key="unused", max_retries=0, timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        slow.chat.completions.create(
            model="mock_llm", messages=[{"role": "user", "content": long_prompt}], max_tokens=4000
        )
    start = time.monotonic()
    client.chat.completions.create(model="mock_llm", messages=[{"role": "user", "content": "after"}])
    assert time.monotonic() - start < 5.0


def test_the_guide_model_streams_and_batches(server: tuple[ServerProcess, str]) -> None:
    """docs/openai.md's own generator (my_llm): streamed or not, batched; it has no max_tokens or stop_words
    input, so the front end applies them (and cancels the request in the model)."""
    client = openai.OpenAI(base_url=server[1] + "/v1", api_key="unused", max_retries=0)
    out = client.completions.create(model="my_llm", prompt="hello big world", max_tokens=2)
    assert (out.choices[0].text, out.choices[0].finish_reason) == ("HELLO BIG ", "length")
    stream = client.completions.create(model="my_llm", prompt="a b c", stream=True)
    assert [c.choices[0].text for c in stream] == ["A ", "B ", "C ", ""]
    stopped = client.completions.create(model="my_llm", prompt="one two three four", stop=["THREE", "x"])
    assert (stopped.choices[0].text, stopped.choices[0].finish_reason) == ("ONE TWO ", "stop")
    chat = client.chat.completions.create(
        model="my_llm", messages=[{"role": "user", "content": "hi there"}], stop="ASSISTANT", stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in chat if c.choices) == "USER: HI THERE "

    async def run() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=server[1] + "/v1", api_key="unused", max_retries=0)
        try:
            outs = await asyncio.gather(
                *(aclient.completions.create(model="my_llm", prompt=f"p{i} q{i}") for i in range(6))
            )
            return [o.choices[0].text for o in outs]
        finally:
            await aclient.close()

    assert asyncio.run(run()) == [f"P{i} Q{i} " for i in range(6)]
    assert sum(size * n for size, n in _batch_sizes(server[0], "my_llm").items()) == 10
