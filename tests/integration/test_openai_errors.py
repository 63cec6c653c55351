"""Bad requests to the OpenAI API get OpenAI's error JSON with the right status, and the server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests

from tests.integration.openai_models import openai_server

LIMIT = 64 * 1024
CHAT = {"model": "mock_llm", "messages": [{"role": "user", "content": "still serving"}]}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("openai")
    models = ("mock_llm", "mock_embedding", "mock_fail")
    with openai_server(root, [f"--http-max-input-size={LIMIT}"], models) as (_, url):
        yield url


def _error(r: requests.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error")
    return err


def _still_serving(base: str) -> None:
    r = requests.post(base + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "user: still serving\nassistant:"  # built-in template


def _post(base: str, path: str, body: object) -> requests.Response:
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return requests.post(base + path, data=data, headers={"Content-Type": "application/json"}, timeout=30)


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "text"),
    [
        ("/v1/chat/completions", {**CHAT, "model": "nope"}, 404, "model", "The model 'nope' does not exist"),
        ("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "model", "does not exist"),
        ("/v1/embeddings", {"model": "nope", "input": "x"}, 404, "model", "does not exist"),
        ("/v1/chat/completions", b'{"model": "mock_llm", "messages": [', 400, None, "Invalid JSON body"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": -3}, 400, "max_tokens", "Expected `int` >= 1"),
        ("/v1/completions", {"model": "mock_llm", "prompt": "x", "max_tokens": -1}, 400, "max_tokens", ">= 1"),
        ("/v1/chat/completions", {**CHAT, "messages": "hello"}, 400, "messages", "Expected `array`"),
        ("/v1/chat/completions", {**CHAT, "messages": [{"content": "no role"}]}, 400, "messages[0]", "`role`"),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role",
         "Invalid value 'wizard'"),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user"}]}, 400, "messages[0]", "`content`"),
        ("/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages", "length >= 1"),
        ("/v1/chat/completions", {**CHAT, "temperature": 9}, 400, "temperature", "<= 2"),
        ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}, 400, "stream_options",
         "only be used when `stream` is True"),
        ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools",
         "requires --tool-call-parser"),
        ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, 400, "tool_choice", "requires tools"),
        ("/v1/chat/completions", {**CHAT, "logprobs": True}, 400, "logprobs", "logprobs are not available"),
        ("/v1/completions", {"model": "mock_llm", "prompt": ""}, 400, "prompt", "non-empty"),
        ("/v1/completions", {"model": "mock_llm", "prompt": [1, 2, 3]}, 400, "prompt", "token ids"),
        ("/v1/embeddings", {"model": "mock_llm", "input": "x"}, 400, "model", "embedding contract"),
        ("/v1/chat/completions", {"model": "mock_embedding", "messages": CHAT["messages"]}, 400, None,
         "generation contract"),
    ],
)  # fmt: skip
def test_bad_request(base: str, path: str, body: object, status: int, param: str | None, text: str) -> None:
    err = _error(_post(base, path, body), status)
    assert text in err["message"]
    assert err["param"] == param
    _still_serving(base)


def test_body_over_the_limit_is_413(base: str) -> None:
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (LIMIT + 10)}]}
    err = _error(_post(base, "/v1/chat/completions", big), 413)
    assert err["code"] == "content_too_large" and str(LIMIT) in err["message"]
    # without Content-Length (chunked): refused while reading
    chunks = (b"x" * 8192 for _ in range(LIMIT // 8192 + 2))
    r = requests.post(base + "/v1/completions", data=chunks, headers={"Content-Type": "application/json"}, timeout=30)
    assert _error(r, 413)["code"] == "content_too_large"
    _still_serving(base)


def test_unknown_route_and_model(base: str) -> None:
    assert _error(requests.get(base + "/v1/nothing", timeout=10), 404)["code"] == "not_found"
    assert _error(requests.get(base + "/v1/models/nope", timeout=10), 404)["code"] == "model_not_found"
    # load/unload need explicit model control
    assert "explicit" in _error(requests.post(base + "/v1/models/mock_llm/unload", timeout=10), 400)["message"]
    _still_serving(base)


def test_error_mid_stream_is_an_error_event(base: str) -> None:
    # mock_fail streams one word, then answers an error: the stream carries it as an error event, then [DONE]
    body = {"model": "mock_fail", "messages": CHAT["messages"], "stream": True}
    r = requests.post(base + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200
    events = [e[len("data: ") :] for e in r.text.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert parsed[1]["choices"][0]["delta"]["content"] == "partial"
    assert parsed[-1]["error"]["message"] == "the mock failed on purpose"
    # not streamed: the error is the answer (the model's INVALID_ARG -> 400)
    r = requests.post(base + "/v1/chat/completions", json={**body, "stream": False}, timeout=30)
    assert _error(r, 400)["message"] == "the mock failed on purpose"
    _still_serving(base)


def test_server_process_alive(base: str) -> None:
    assert requests.get(base + "/health/ready", timeout=10).status_code == 200
