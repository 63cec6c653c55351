"""POST /v1/embeddings.

Tensor contract (Trireme's; Triton's front end serves embeddings only through vLLM): one inference request per
input string, so a model with dynamic batching batches them.
* `text_input` BYTES: the string (shape [1], or [1, 1] with batching);
* `embedding` (any float datatype, any shape): the vector, flattened;
* optional `dimensions` (integer input): the `dimensions` asked for; a model without it gets its vector cut to
  that length here and L2-normalized again (Matryoshka-style);
* optional `num_input_tokens` output: usage.prompt_tokens (0 when the model reports nothing).
A model in vLLM's format (an `embedding_request` BYTES input, JSON `{"input", "pooling_params"}`) gets the whole
request at once and answers a JSON list of vectors (or one vector) in `text_output`.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from service.errors import invalid_arg
from service.frontend.openai.context import Context
from service.frontend.openai.convert import Contract, encode, parse
from service.frontend.openai.errors import JSON, bad_request
from service.frontend.openai.schemas import EmbeddingRequest, decode
from service.types import InferRequest, InferResponse
from shm.tensor import DATATYPE_TO_NUMPY, element_count


def _vector(response: InferResponse, model: str) -> tuple[np.ndarray, int]:
    """(embedding as float32, num_input_tokens or 0) of one response."""
    if response.error is not None:
        raise response.error
    vector, tokens = None, 0
    for o in response.outputs:
        if o.name == "embedding" and o.data is not None:
            dtype = DATATYPE_TO_NUMPY.get(o.datatype)
            if dtype is None or o.datatype in ("BYTES", "BOOL"):
                raise invalid_arg(f"model '{model}' output 'embedding' must be a float tensor, not {o.datatype}")
            vector = np.frombuffer(o.data, dtype, count=element_count(o.shape)).astype(np.float32)
        elif o.name == "num_input_tokens":
            tokens = parse(response).prompt_tokens or 0
    if vector is None:
        raise invalid_arg(f"model '{model}' answered no 'embedding' output (docs/openai.md)")
    return vector, tokens


def _shorten(vector: np.ndarray, dimensions: int | None) -> np.ndarray:
    if dimensions is None or dimensions == vector.size:
        return vector
    if dimensions > vector.size:
        raise bad_request(f"dimensions={dimensions} is more than the model's {vector.size}", "dimensions")
    short = vector[:dimensions]
    norm = float(np.linalg.norm(short))
    return short / norm if norm > 0 else short


def _item(index: int, vector: np.ndarray, encoding: str) -> dict[str, Any]:
    value: Any = vector.tolist()
    if encoding == "base64":
        value = base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return {"object": "embedding", "index": index, "embedding": value}


async def embeddings(ctx: Context, request: web.Request, body: bytes) -> web.Response:
    """The handler."""
    req = decode(body, EmbeddingRequest)
    target = ctx.target(req.model)
    texts = [req.input] if isinstance(req.input, str) else req.input
    if not texts or not all(isinstance(t, str) for t in texts):
        raise bad_request("input must be a string or a list of strings (token ids are not supported)", "input")
    contract = target.contract
    if "embedding_request" in contract.inputs:
        vectors, tokens = await _vllm(ctx, contract, req, texts)
    else:
        if "text_input" not in contract.inputs or "embedding" not in contract.outputs:
            raise bad_request(
                f"model '{target.model}' does not follow the embedding contract: it needs a 'text_input' input and "
                "an 'embedding' output (docs/openai.md)",
                "model",
            )
        results = await asyncio.gather(*(ctx.engine.infer(_request(contract, t, req.dimensions)) for t in texts))
        pairs = [_vector(r, target.model) for r in results]
        vectors, tokens = [v for v, _ in pairs], sum(n for _, n in pairs)
    data = [_item(i, _shorten(v, req.dimensions), req.encoding_format) for i, v in enumerate(vectors)]
    out = {
        "object": "list",
        "data": data,
        "model": req.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return web.Response(body=orjson.dumps(out), content_type=JSON)


def _request(contract: Contract, text: str, dimensions: int | None) -> InferRequest:
    req = InferRequest(contract.name, "")
    req.inputs.append(encode(contract.inputs["text_input"], [text]))
    if dimensions is not None and "dimensions" in contract.inputs:
        req.inputs.append(encode(contract.inputs["dimensions"], [dimensions]))
    return req


async def _vllm(
    ctx: Context, contract: Contract, req: EmbeddingRequest, texts: list[str]
) -> tuple[list[np.ndarray], int]:
    payload: dict[str, Any] = {"input": req.input, "pooling_params": {}}
    if req.dimensions is not None:
        payload["pooling_params"]["dimensions"] = [req.dimensions]
    infer = InferRequest(contract.name, "")
    infer.inputs.append(encode(contract.inputs["embedding_request"], [json.dumps(payload)]))
    for flag in ("return_num_input_tokens", "return_num_output_tokens"):
        if flag in contract.inputs:
            infer.inputs.append(encode(contract.inputs[flag], [True]))
    chunk = parse(await ctx.engine.infer(infer))
    try:
        value = json.loads(chunk.text)
    except ValueError:
        raise invalid_arg(f"model '{contract.name}' answered text_output that is not JSON") from None
    rows = value if value and isinstance(value[0], list) else [value]
    return [np.asarray(r, np.float32) for r in rows], chunk.prompt_tokens or 0
