"""POST /v1/chat/completions: messages -> chat template -> the model -> a chat.completion (or SSE chunks).

Tool calls: with `tool_choice` naming a function (or "required": the first tool), the generated text is that
function's arguments (the model is asked for JSON via the guided-decoding inputs when it has them); with tools and
`auto`, the --tool-call-parser finds calls in the text (tools.py).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import orjson
from aiohttp import web

from service.frontend.openai.context import Context, Target, request_id
from service.frontend.openai.convert import GenerationParams, chat_logprobs
from service.frontend.openai.errors import JSON, bad_request, error_response, to_openai_error
from service.frontend.openai.generation import Generation, launch
from service.frontend.openai.schemas import ChatCompletionRequest, Message, decode, message_text
from service.frontend.openai.sse import EventStream
from service.frontend.openai.tools import ToolCall, ToolParser


def _message_dict(m: Message) -> dict[str, Any]:
    """A message as chat templates expect it (content as one string; tool call arguments as objects)."""
    out: dict[str, Any] = {"role": m.__struct_config__.tag, "content": message_text(getattr(m, "content", None))}
    name = getattr(m, "name", None)
    if name is not None:
        out["name"] = name
    calls = getattr(m, "tool_calls", None)
    if calls:
        out["tool_calls"] = []
        for c in calls:
            try:
                arguments: Any = json.loads(c.function.arguments)
            except ValueError:
                arguments = c.function.arguments
            fn = {"name": c.function.name, "arguments": arguments}
            out["tool_calls"].append({"id": c.id, "type": "function", "function": fn})
    call_id = getattr(m, "tool_call_id", None)
    if call_id is not None:
        out["tool_call_id"] = call_id
    return out


def _named_tool(req: ChatCompletionRequest) -> tuple[str | None, bool]:
    """(function the model must call or None, whether auto tool parsing applies); 400 for bad combinations."""
    choice = req.tool_choice
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise bad_request(f"Invalid tool_choice '{choice}': expected 'none', 'auto', 'required' or a function")
    if choice is not None and choice != "none" and not req.tools:
        what = '"required" tool choice' if choice == "required" else "Named tool choice"
        what = '"auto" tool choice' if choice == "auto" else what
        raise bad_request(f"{what} requires tools to be provided", "tool_choice")
    if choice == "required":
        assert req.tools
        return req.tools[0].function.name, False
    if choice is not None and not isinstance(choice, str):
        if not any(t.function.name == choice.function.name for t in req.tools or []):
            raise bad_request(f"Tool '{choice.function.name}' has not been passed in `tools`.", "tool_choice")
        return choice.function.name, False
    return None, bool(req.tools) and choice in (None, "auto")


def _validate(ctx: Context, req: ChatCompletionRequest, target: Target) -> tuple[str | None, bool]:
    target.contract.check_generation()
    if req.logit_bias is not None:
        raise bad_request("logit_bias is not supported", "logit_bias")
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("`top_logprobs` can only be used when `logprobs` is True", "top_logprobs")
    if req.logprobs and not target.contract.supports_logprobs:
        raise bad_request(
            f"logprobs are not available for model '{target.model}': it has no 'sampling_parameters' and "
            "'return_logprobs' inputs (the vLLM format)",
            "logprobs",
        )
    if req.stream_options is not None and not req.stream:
        raise bad_request("`stream_options` can only be used when `stream` is True", "stream_options")
    named, auto = _named_tool(req)
    if auto and ctx.options.tool_call_parser == "":
        raise bad_request(
            '"auto" tool choice requires --tool-call-parser to be set'
            if req.tool_choice == "auto"
            else "having tools in the request requires --tool-call-parser to be set",
            "tools",
        )
    return named, auto


def _finish(gen: Generation, index: int, max_tokens: int, calls: bool) -> str:
    if calls:
        return "tool_calls"
    return "length" if gen.choices[index].completion_tokens >= max_tokens else "stop"


async def chat_completions(ctx: Context, request: web.Request, body: bytes) -> web.StreamResponse:
    """The handler."""
    req = decode(body, ChatCompletionRequest)
    target = ctx.target(req.model)
    named, auto = _validate(ctx, req, target)
    messages = [_message_dict(m) for m in req.messages]
    tools = [{"type": "function", "function": _function_json(t)} for t in req.tools] if req.tools else None
    prompt = ctx.templates.render(ctx.template(target), messages, tools)
    max_tokens = req.max_completion_tokens or req.max_tokens or ctx.options.default_max_tokens
    guided = None
    if named is not None:
        fn = next(t.function for t in req.tools or [] if t.function.name == named)
        guided = json.dumps(fn.parameters or {})
    params = GenerationParams(
        prompt,
        req.stream,
        max_tokens,
        req.temperature,
        req.top_p,
        req.frequency_penalty,
        req.presence_penalty,
        req.seed,
        [req.stop] if isinstance(req.stop, str) else list(req.stop or []),
        None,
        (req.top_logprobs or 0) if req.logprobs else None,
        target.lora,
        guided,
    )
    rid = request_id("chatcmpl")
    gen = launch(ctx.engine, target.contract, [params], req.n or 1, rid)
    head = {"id": rid, "created": int(time.time()), "model": req.model, "system_fingerprint": None}
    parsers = [ctx.tool_parser() if auto else None for _ in gen.requests]
    top = req.top_logprobs or 0
    try:
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            return await _stream(request, gen, head, named, parsers, max_tokens, top, include_usage)
        return await _whole(gen, head, named, parsers, max_tokens, top)
    finally:
        gen.cancel()  # whatever did not finish (an error, the client gone) stops in the model


def _function_json(tool: Any) -> dict[str, Any]:
    fn = tool.function
    out: dict[str, Any] = {"name": fn.name}
    if fn.description is not None:
        out["description"] = fn.description
    if fn.parameters is not None:
        out["parameters"] = fn.parameters
    return out


def _named_call(name: str, arguments: str, index: int | None, rid: str) -> dict[str, Any]:
    return ToolCall(f"call_{rid[-24:]}", name, arguments).as_json(index)


async def _whole(
    gen: Generation,
    head: dict[str, Any],
    named: str | None,
    parsers: list[ToolParser | None],
    max_tokens: int,
    top: int,
) -> web.Response:
    async with contextlib.aclosing(gen.chunks()) as chunks:
        async for _ in chunks:
            pass
    choices = []
    for i, state in enumerate(gen.choices):
        text = "".join(state.text)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        calls: list[ToolCall] = []
        parser = parsers[i]
        if named is not None:
            message.update(content=None, tool_calls=[_named_call(named, text, None, head["id"])])
        elif parser is not None:
            content, calls = parser.parse(text)
            if calls:
                message.update(content=content or None, tool_calls=[c.as_json() for c in calls])
        logprobs = {"content": chat_logprobs(state.logprobs, top)} if state.logprobs else None
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": _finish(gen, i, max_tokens, bool(calls)),
            }
        )
    body = {**head, "object": "chat.completion", "choices": choices, "usage": gen.usage()}
    return web.Response(body=orjson.dumps(body), content_type=JSON)


async def _stream(
    request: web.Request,
    gen: Generation,
    head: dict[str, Any],
    named: str | None,
    parsers: list[ToolParser | None],
    max_tokens: int,
    top: int,
    include_usage: bool,
) -> web.StreamResponse:
    stream = EventStream(request)
    base = {**head, "object": "chat.completion.chunk"}

    def event(choice: dict[str, Any]) -> dict[str, Any]:
        out = {**base, "choices": [choice]}
        if include_usage:
            out["usage"] = None
        return out

    def delta(index: int, value: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        return event({"index": index, "delta": value, "logprobs": logprobs, "finish_reason": finish})

    named_started: set[int] = set()
    try:
        for i in range(len(gen.requests)):
            await stream.send(delta(i, {"role": "assistant", "content": ""}))
        async with contextlib.aclosing(gen.chunks()) as chunks:
            async for i, chunk in chunks:
                parser = parsers[i]
                logprobs = {"content": chat_logprobs(chunk.logprobs, top)} if chunk.logprobs else None
                if chunk.text:
                    if named is not None:
                        call = _named_call(named, chunk.text, 0, head["id"])
                        if i in named_started:
                            call = {"index": 0, "function": {"arguments": chunk.text}}
                        named_started.add(i)
                        await stream.send(delta(i, {"tool_calls": [call]}, None, logprobs))
                    else:
                        content = parser.feed(chunk.text) if parser is not None else chunk.text
                        if content or logprobs:
                            await stream.send(delta(i, {"content": content}, None, logprobs))
                if chunk.final:
                    calls: list[ToolCall] = []
                    if parser is not None:
                        content, calls = parser.finish()
                        if content:
                            await stream.send(delta(i, {"content": content}))
                        if calls:
                            await stream.send(delta(i, {"tool_calls": [c.as_json(k) for k, c in enumerate(calls)]}))
                    await stream.send(delta(i, {}, _finish(gen, i, max_tokens, bool(calls))))
    except ConnectionResetError:  # the client went away: nobody to tell
        raise
    except Exception as e:
        if stream.response is None:
            return error_response(e)
        await stream.error(to_openai_error(e))
    if include_usage:
        await stream.send({**base, "choices": [], "usage": gen.usage()})
    return await stream.done()
