"""POST /v1/completions: prompt(s) -> the model -> a text_completion (or SSE chunks).

`prompt` is a string or a list of strings (choice index = prompt * n + j); token-id prompts are not supported.
`echo` goes to the model's `exclude_input_in_output` input when it has one; otherwise the prompt is prepended
here.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import orjson
from aiohttp import web

from service.frontend.openai.context import Context, Target, request_id
from service.frontend.openai.convert import GenerationParams, completion_logprobs
from service.frontend.openai.errors import JSON, bad_request, error_response, to_openai_error
from service.frontend.openai.generation import Generation, launch
from service.frontend.openai.schemas import CompletionRequest, decode
from service.frontend.openai.sse import EventStream


def _prompts(req: CompletionRequest) -> list[str]:
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise bad_request("prompt must be a non-empty string or a list of strings (token ids are not supported)",
                          "prompt")  # fmt: skip
    if not all(prompts):
        raise bad_request("prompt must be non-empty", "prompt")
    return prompts


def _validate(req: CompletionRequest, target: Target) -> None:
    target.contract.check_generation()
    if req.suffix is not None:
        raise bad_request("suffix is not currently supported", "suffix")
    if req.best_of is not None and req.best_of > 1:
        raise bad_request(f"Received best_of={req.best_of}, but only best_of=1 is supported (use n)", "best_of")
    if req.logit_bias is not None:
        raise bad_request("logit_bias is not supported", "logit_bias")
    if req.logprobs and not target.contract.supports_logprobs:
        raise bad_request(
            f"logprobs are not available for model '{target.model}': it has no 'sampling_parameters' and "
            "'return_logprobs' inputs (the vLLM format)",
            "logprobs",
        )
    if req.stream_options is not None and not req.stream:
        raise bad_request("`stream_options` can only be used when `stream` is True", "stream_options")


async def completions(ctx: Context, request: web.Request, body: bytes) -> web.StreamResponse:
    """The handler."""
    req = decode(body, CompletionRequest)
    target = ctx.target(req.model)
    prompts = _prompts(req)
    _validate(req, target)
    n = req.n or 1
    max_tokens = req.max_tokens or ctx.options.default_max_tokens
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    model_echoes = target.contract.echo_tensor is not None
    params = [
        GenerationParams(
            prompt,
            req.stream,
            max_tokens,
            req.temperature,
            req.top_p,
            req.frequency_penalty,
            req.presence_penalty,
            req.seed,
            stop,
            req.echo if model_echoes else None,
            req.logprobs or None,
            target.lora,
        )
        for prompt in prompts
    ]
    rid = request_id("cmpl")
    gen = launch(ctx.engine, target.contract, params, n, rid)
    # the prompt each choice starts with when the model does not echo it itself
    echo = [p if req.echo and not model_echoes else "" for p in prompts for _ in range(n)]
    head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": req.model}
    head["system_fingerprint"] = None
    try:
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            return await _stream(request, gen, head, echo, max_tokens, include_usage)
        return await _whole(gen, head, echo, max_tokens)
    finally:
        gen.cancel()  # whatever did not finish (an error, the client gone) stops in the model


def _finish(gen: Generation, index: int, max_tokens: int) -> str:
    return "length" if gen.choices[index].completion_tokens >= max_tokens else "stop"


async def _whole(gen: Generation, head: dict[str, Any], echo: list[str], max_tokens: int) -> web.Response:
    async with contextlib.aclosing(gen.chunks()) as chunks:
        async for _ in chunks:
            pass
    choices = []
    for i, state in enumerate(gen.choices):
        logprobs = completion_logprobs(state.logprobs, len(echo[i])) if state.logprobs else None
        text = echo[i] + "".join(state.text)
        choices.append({"index": i, "text": text, "logprobs": logprobs, "finish_reason": _finish(gen, i, max_tokens)})
    body = {**head, "choices": choices, "usage": gen.usage()}
    return web.Response(body=orjson.dumps(body), content_type=JSON)


async def _stream(
    request: web.Request, gen: Generation, head: dict[str, Any], echo: list[str], max_tokens: int, include_usage: bool
) -> web.StreamResponse:
    stream = EventStream(request)
    offsets = [len(e) for e in echo]

    def event(index: int, text: str, finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        out = {**head, "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}]}
        if include_usage:
            out["usage"] = None
        return out

    try:
        for i, prefix in enumerate(echo):
            if prefix:
                await stream.send(event(i, prefix))
        async with contextlib.aclosing(gen.chunks()) as chunks:
            async for i, chunk in chunks:
                if chunk.text or chunk.logprobs:
                    logprobs = completion_logprobs(chunk.logprobs, offsets[i]) if chunk.logprobs else None
                    offsets[i] += len(chunk.text)
                    await stream.send(event(i, chunk.text, None, logprobs))
                if chunk.final:
                    await stream.send(event(i, "", _finish(gen, i, max_tokens)))
    except ConnectionResetError:  # the client went away: nobody to tell
        raise
    except Exception as e:
        if stream.response is None:
            return error_response(e)
        await stream.error(to_openai_error(e))
    if include_usage:
        await stream.send({**head, "choices": [], "usage": gen.usage()})
    return await stream.done()
