"""The OpenAI API through the official `openai` client (sync and async, streamed and not) and curl (SSE).

The server's chat template renders just the last message (a --tokenizer folder), and mock_llm echoes its prompt
word by word, so a chat answer is the last message's text.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest
import requests

from tests.conftest import ServerProcess
from tests.integration.openai_models import last_message_tokenizer, openai_server

openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install openai)")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "the weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    root = tmp_path_factory.mktemp("openai")
    args = [
        "--tokenizer",
        str(last_message_tokenizer(root)),
        "--tool-call-parser",
        "llama3",
        "--model-control-mode=explicit",
        "--load-model=mock_llm",
        "--load-model=mock_embedding",
        "--load-model=mock_vllm",
        "--lora-separator",
        "_lora_",
        "--openai-restricted-api",
        "model-management",
        "admin-key",
        "secret",
    ]
    with openai_server(root, args) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: tuple[ServerProcess, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[1] + "/v1", api_key="unused", max_retries=0)


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    ids = sorted(m.id for m in client.models.list())
    # mock_llm_nobatch is not loaded (explicit mode); mock_llm's multi_lora.json lists the adapter 'doll'
    assert ids == ["mock_embedding", "mock_llm", "mock_llm_lora_doll", "mock_vllm"]
    model = client.models.retrieve("mock_llm")
    assert model.id == "mock_llm" and model.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("nope")
    assert e.value.body["code"] == "model_not_found"


def test_chat_sync(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="mock_llm",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "the quick brown fox"}],
        max_tokens=50,
    )
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == "the quick brown fox"
    assert out.choices[0].finish_reason == "stop"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (4, 4, 8)


def test_chat_sync_max_tokens_stop_and_n(client: openai.OpenAI) -> None:
    text = "one two three four five six"
    short = client.chat.completions.create(model="mock_llm", messages=[{"role": "user", "content": text}], max_tokens=2)
    assert short.choices[0].message.content == "one two"
    assert short.choices[0].finish_reason == "length"
    stopped = client.chat.completions.create(
        model="mock_llm", messages=[{"role": "user", "content": text}], stop=[" four"], max_tokens=50
    )
    assert stopped.choices[0].message.content == "one two three"
    many = client.chat.completions.create(
        model="mock_llm", messages=[{"role": "user", "content": text}], n=3, max_tokens=50, seed=7
    )
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert all(c.message.content == text for c in many.choices)
    assert many.usage.prompt_tokens == 6 and many.usage.completion_tokens == 18


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="mock_llm",
        messages=[{"role": "user", "content": "streaming one word at a time"}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=50,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) == 6  # one chunk per word
    assert "".join(pieces) == "streaming one word at a time"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_async_stream_and_not(server: tuple[ServerProcess, str]) -> None:
    async def run() -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url=server[1] + "/v1", api_key="unused", max_retries=0)
        try:
            whole = await client.chat.completions.create(
                model="mock_llm", messages=[{"role": "user", "content": "async hello world"}]
            )
            stream = await client.chat.completions.create(
                model="mock_llm", messages=[{"role": "user", "content": "async streamed hello"}], stream=True
            )
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            return whole.choices[0].message.content or "", "".join(parts)
        finally:
            await client.close()

    whole, streamed = asyncio.run(run())
    assert whole == "async hello world"
    assert streamed == "async streamed hello"


def test_completions_sync_stream_and_echo(client: openai.OpenAI) -> None:
    out = client.completions.create(model="mock_llm", prompt="alpha beta gamma", max_tokens=2)
    assert out.object == "text_completion"
    assert out.choices[0].text == "alpha beta" and out.choices[0].finish_reason == "length"
    echo = client.completions.create(model="mock_llm", prompt="alpha beta", max_tokens=5, echo=True)
    assert echo.choices[0].text == "alpha beta" + "alpha beta"
    two = client.completions.create(model="mock_llm", prompt=["a b", "c d e"], max_tokens=5)
    assert [c.text for c in two.choices] == ["a b", "c d e"]
    stream = client.completions.create(model="mock_llm", prompt="x y z", max_tokens=5, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == "x y z"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_curl_sse(server: tuple[ServerProcess, str]) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    body = json.dumps({"model": "mock_llm", "messages": [{"role": "user", "content": "curl says hi"}], "stream": True})
    out = subprocess.run(
        ["curl", "-sN", server[1] + "/v1/chat/completions", "-H", "Content-Type: application/json", "-d", body],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    events = [line[len("data: ") :] for line in out.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "curl says hi"


def test_tool_calls_llama3(client: openai.OpenAI) -> None:
    call = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
    out = client.chat.completions.create(
        model="mock_llm", messages=[{"role": "user", "content": call}], tools=TOOLS, max_tokens=50
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris"}
    # streamed: the call is held back until it is complete, plain text still streams as content
    stream = client.chat.completions.create(
        model="mock_llm", messages=[{"role": "user", "content": call}], tools=TOOLS, max_tokens=50, stream=True
    )
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
    assert [tc.function.name for tc in calls] == ["get_weather"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    plain = client.chat.completions.create(
        model="mock_llm", messages=[{"role": "user", "content": "no tools needed"}], tools=TOOLS
    )
    assert plain.choices[0].message.content == "no tools needed" and not plain.choices[0].message.tool_calls
    named = client.chat.completions.create(
        model="mock_llm",
        messages=[{"role": "user", "content": '{"city": "Oslo"}'}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert named.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert json.loads(named.choices[0].message.tool_calls[0].function.arguments) == {"city": "Oslo"}


def test_embeddings(client: openai.OpenAI) -> None:
    out = client.embeddings.create(model="mock_embedding", input=["hello world", "bye"])
    assert [d.index for d in out.data] == [0, 1]
    vectors = [np.array(d.embedding) for d in out.data]
    assert all(v.shape == (8,) and abs(np.linalg.norm(v) - 1) < 1e-5 for v in vectors)
    assert out.usage.prompt_tokens == 3
    short = client.embeddings.create(model="mock_embedding", input="hello world", dimensions=4)
    assert len(short.data[0].embedding) == 4
    raw = requests.post(
        str(client.base_url) + "embeddings",
        json={"model": "mock_embedding", "input": "hello world", "encoding_format": "base64"},
        timeout=30,
    ).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(decoded, vectors[0], rtol=1e-6)


def test_load_unload_with_restricted_api(client: openai.OpenAI, server: tuple[ServerProcess, str]) -> None:
    base = server[1]
    r = requests.post(f"{base}/v1/models/mock_llm_nobatch/load", timeout=60)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = requests.post(f"{base}/v1/models/mock_llm_nobatch/load", headers={"admin-key": "secret"}, timeout=60)
    assert r.status_code == 200 and r.json()["id"] == "mock_llm_nobatch"
    assert "mock_llm_nobatch" in [m.id for m in client.models.list()]
    out = client.chat.completions.create(model="mock_llm_nobatch", messages=[{"role": "user", "content": "no batch"}])
    assert out.choices[0].message.content == "no batch"
    r = requests.post(f"{base}/v1/models/mock_llm_nobatch/unload", headers={"admin-key": "secret"}, timeout=60)
    assert r.json() == {"status": "success", "model": "mock_llm_nobatch"}
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="mock_llm_nobatch", messages=[{"role": "user", "content": "gone"}])


def test_lora_selection(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model="mock_llm_lora_doll", messages=[{"role": "user", "content": "lora"}])
    assert out.model == "mock_llm_lora_doll" and out.choices[0].message.content == "lora"
    with pytest.raises(openai.BadRequestError, match="Unknown LoRA: nope"):
        client.chat.completions.create(model="mock_llm_lora_nope", messages=[{"role": "user", "content": "x"}])


def test_vllm_format_with_logprobs(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="mock_vllm",
        messages=[{"role": "user", "content": "red green blue"}],
        max_tokens=2,
        logprobs=True,
        top_logprobs=2,
    )
    assert out.choices[0].message.content == "RED GREEN"  # the model's own chat template upper-cases
    tokens = out.choices[0].logprobs.content
    assert [(t.token, t.logprob) for t in tokens] == [("RED", 0.0), ("GREEN", -0.1)]
    assert [a.token for a in tokens[1].top_logprobs] == ["GREEN", "alt1"]
    assert out.usage.completion_tokens == 2
    text = client.completions.create(model="mock_vllm", prompt="cyan magenta", max_tokens=5, logprobs=1)
    assert text.choices[0].text == "cyan magenta"
    assert text.choices[0].logprobs.tokens == ["cyan", "magenta"]
    assert text.choices[0].logprobs.text_offset == [0, 4]


def test_health_and_metrics(client: openai.OpenAI, server: tuple[ServerProcess, str]) -> None:
    client.chat.completions.create(model="mock_llm", messages=[{"role": "user", "content": "count me"}], stream=False)
    assert requests.get(server[1] + "/health/ready", timeout=10).status_code == 200
    for url in (server[1] + "/metrics", server[0].metrics_url):  # the OpenAI port and the metrics port alike
        text = requests.get(url, timeout=10).text
        assert 'trireme_time_to_first_token_seconds_count{model="mock_llm"}' in text
        assert 'trireme_inter_token_latency_seconds_bucket{model="mock_llm",le="+Inf"}' in text
        series = 'trireme_generated_tokens_total{model="mock_llm"}'
        generated = [line for line in text.splitlines() if line.startswith(series)]
        assert generated and float(generated[0].split()[-1]) >= 2


def test_kserve_stays_on(server: tuple[ServerProcess, str]) -> None:
    r = requests.get(f"http://{server[0].http_url}/v2/models/mock_llm/ready", timeout=10)
    assert r.status_code == 200
