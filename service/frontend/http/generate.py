"""Triton's generate extension: POST .../generate (one JSON response) and .../generate_stream (server-sent events).

The request is a flat JSON object: a key naming a model input becomes that input (a scalar or a 1-D array,
reshaped to the input's metadata shape: fixed dims first, the innermost variable dim takes the rest, other
variable dims 1); `parameters` holds request parameters; any other key is a request parameter too. A response
is a flat JSON object: `model_name`, `model_version`, `id` when set, the response parameters, and each output by
name (a scalar when it has one element, else a flat array). generate_stream sends each response as
`data: <json>\\n\\n`; errors as `data: {"error": "..."}`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson

from service.core.engine import TensorMetadata
from service.core.facade import Facade
from service.errors import ErrorCode, ServiceError, invalid_arg
from service.frontend.http.json_tensors import json_data_to_bytes
from service.frontend.http.message import JSON, Request, Response, Stream
from service.frontend.http.util import error_body, read_json_object, to_service_error
from service.types import InferRequest, InferResponse, InputTensor
from shm.tensor import DATATYPE_TO_NUMPY, deserialize_bytes, element_count


def fit_shape(meta: TensorMetadata, count: int) -> list[int]:
    """Spread `count` elements over the metadata shape (Triton's two-pass rule)."""
    shape = list(meta.shape)
    for d in reversed(shape):
        if d != -1:
            if d == 0 or count % d:
                raise invalid_arg(f"The schema can not convert input '{meta.name}' to tensor with proper shape")
            count //= d
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i], count = count, 1
    if count != 1:
        raise invalid_arg(f"The schema can not convert input '{meta.name}' to tensor with proper shape")
    return shape


def _parameter(req: InferRequest, key: str, value: Any) -> None:
    if isinstance(value, bool | int | float | str):
        req.parameters[key] = value
    else:
        raise invalid_arg(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def build_request(body: dict[str, Any], model: str, version: str, inputs: list[TensorMetadata]) -> InferRequest:
    """A generate body -> InferRequest (inputs by name, everything else parameters)."""
    by_name = {t.name: t for t in inputs}
    req = InferRequest(model, version)

    def add(key: str, value: Any) -> None:
        meta = by_name.get(key)
        if meta is None:
            _parameter(req, key, value)
            return
        values = value if isinstance(value, list) else [value]
        shape = fit_shape(meta, len(values))
        req.inputs.append(InputTensor(key, meta.datatype, shape, json_data_to_bytes(key, meta.datatype, shape, values)))

    for key, value in body.items():
        if key == "parameters" and isinstance(value, dict):
            if key in by_name:
                raise invalid_arg("Keyword 'parameters' for nested schema also given as input tensor name")
            for k, v in value.items():
                add(k, v)
        else:
            add(key, value)
    return req


def response_json(resp: InferResponse) -> bytes:
    """One response as the generate extension's flat JSON object."""
    out: dict[str, Any] = {}
    if resp.id:
        out["id"] = resp.id
    out["model_name"] = resp.model_name
    out["model_version"] = resp.model_version
    out.update(resp.parameters)
    for o in resp.outputs:
        if o.data is None:
            continue
        count = element_count(o.shape)
        if o.datatype == "BYTES":
            values: Any = [b.decode("utf-8", "replace") for b in deserialize_bytes(o.data, count)]
        elif o.datatype in DATATYPE_TO_NUMPY:
            values = np.frombuffer(o.data, DATATYPE_TO_NUMPY[o.datatype]).tolist()
        else:
            raise ServiceError(
                ErrorCode.UNSUPPORTED, f"output '{o.name}' of datatype {o.datatype} cannot be sent as JSON"
            )
        out[o.name] = values[0] if count == 1 else values
    return orjson.dumps(out)


class GenerateRoutes:
    """The two generate handlers."""

    def __init__(self, engine: Facade, max_input_size: int) -> None:
        self.engine = engine
        self.max_input_size = max_input_size

    async def _start(self, request: Request) -> tuple[InferRequest, Any, asyncio.Queue[InferResponse]]:
        mi = request.match_info
        model, version = mi["model"], mi.get("version", "")
        encoding = request.headers.get("Content-Encoding")
        if encoding and encoding.lower() != "identity":
            raise invalid_arg("Unsupported content-encoding, only 'identity' is supported.")
        meta = self.engine.model_metadata(model, version)
        body = await read_json_object(request, self.max_input_size)
        req = build_request(body, model, version, meta.inputs)
        queue: asyncio.Queue[InferResponse] = asyncio.Queue()
        mv = self.engine.submit(req, queue.put_nowait)
        return req, mv, queue

    async def generate(self, request: Request) -> Response:
        """Exactly one response, as JSON."""
        _, _, queue = await self._start(request)
        responses: list[InferResponse] = []
        while True:
            response = await queue.get()
            if not response.null:
                responses.append(response)
            if response.final:
                break
        if len(responses) != 1:
            raise ServiceError(
                ErrorCode.INTERNAL,
                "generate expects model to produce exactly 1 response, use generate stream for model that generates "
                "various number of responses",
            )
        if responses[0].error is not None:
            raise responses[0].error
        return Response(200, response_json(responses[0]), JSON)

    async def generate_stream(self, request: Request) -> Stream:
        """Every response as a server-sent event; the status is decided by the first one."""
        req, mv, queue = await self._start(request)
        stream: Stream | None = None
        try:
            while True:
                response = await queue.get()
                if response.null and not response.final:
                    continue
                if stream is None:
                    status = 400 if response.error is not None else 200
                    stream = await request.open_stream(status, "text/event-stream; charset=utf-8")
                if not response.null:
                    await stream.write(b"data: " + self._event(response) + b"\n\n")
                if response.final:
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            self.engine.cancel(req, mv)  # the client went away: stop the model's work for it
            raise
        assert stream is not None
        stream.close()
        return stream

    @staticmethod
    def _event(response: InferResponse) -> bytes:
        if response.error is not None:
            return error_body(response.error.message)
        try:
            return response_json(response)
        except Exception as e:
            return error_body(to_service_error(e).message)
