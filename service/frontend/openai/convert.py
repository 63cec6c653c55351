"""OpenAI requests -> InferRequests of the model, and model responses -> text, token counts, logprobs.

The tensor contract is the one of Triton's OpenAI front end, so a model written for it runs unchanged:

* TensorRT-LLM format (the default, and what Python models use): `text_input` BYTES, `stream` BOOL, optional
  `max_tokens` INT32, `temperature`/`top_p`/`frequency_penalty`/`presence_penalty` FP32, `seed` UINT64,
  `stop_words` BYTES [1, k], `exclude_input_in_output` BOOL (echo), `guided_decoding_guide_type`/`_guide` BYTES
  (named tool choice), `return_num_input_tokens`/`return_num_output_tokens` BOOL.
* vLLM format (a model with a `sampling_parameters` input): `text_input`, `stream`, `sampling_parameters` (the
  sampling fields as a JSON string), `exclude_input_in_output`, `return_logprobs`, `return_num_*_tokens`.

A model without `stop_words` or `max_tokens` inputs gets those limits applied here (limits.py).

Outputs: `text_output` BYTES (the new text of each response), optional `num_input_tokens`/`num_output_tokens`
(usage; per response, summed over a stream) and `logprobs` (vLLM's JSON). Unlike Triton's front end, only the
optional inputs the model declares are sent, each with the datatype and shape the model declares (a batched model
gets [1, ...]), so a minimal model needs only `text_input` (and `stream`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from service.core.engine import ModelMetadata, TensorMetadata
from service.errors import invalid_arg
from service.frontend.http.generate import fit_shape
from service.frontend.openai.limits import Limits
from service.types import InferRequest, InferResponse, InputTensor
from shm.tensor import DATATYPE_TO_NUMPY, deserialize_bytes, element_count, serialize_bytes

ECHO_TENSORS = ("exclude_input_in_output", "sampling_param_exclude_input_from_output")


@dataclass(slots=True)
class GenerationParams:
    """What one choice asks of the model, independent of the tensor format."""

    prompt: str
    stream: bool
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    echo: bool | None = None
    logprobs: int | None = None  # number of top logprobs wanted (None: not requested)
    lora: str | None = None
    guided_json: str | None = None


@dataclass(slots=True)
class Chunk:
    """What one model response carries."""

    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    logprobs: Any = None  # vLLM format: a list of {token_id: {logprob, rank, decoded_token}}
    final: bool = False


class Contract:
    """The generation inputs a model declares (from its metadata)."""

    def __init__(self, meta: ModelMetadata) -> None:
        self.name = meta.name
        self.inputs: dict[str, TensorMetadata] = {t.name: t for t in meta.inputs}
        self.outputs = {t.name for t in meta.outputs}
        self.vllm = "sampling_parameters" in self.inputs
        self.echo_tensor = next((n for n in ECHO_TENSORS if n in self.inputs), None)

    def check_generation(self) -> None:
        """400 when the model cannot generate text for the OpenAI API."""
        if "text_input" not in self.inputs or "text_output" not in self.outputs:
            raise invalid_arg(
                f"model '{self.name}' does not follow the generation contract: it needs a 'text_input' input and "
                "a 'text_output' output (docs/openai.md)"
            )

    @property
    def supports_logprobs(self) -> bool:
        """Whether the model can be asked for logprobs (vLLM format with a `return_logprobs` input)."""
        return self.vllm and "return_logprobs" in self.inputs

    def limits(self, params: GenerationParams) -> Limits | None:
        """The stop strings and max_tokens this model does not apply itself (None: it applies both)."""
        if self.vllm:
            return None
        stop = params.stop if "stop_words" not in self.inputs else []
        max_chunks = params.max_tokens if self._counts_tokens_here else None
        return Limits(stop, max_chunks) if stop or max_chunks is not None else None

    @property
    def _counts_tokens_here(self) -> bool:
        # no max_tokens input, but a stream input: asked to stream, so every response is a token to count
        return not self.vllm and "max_tokens" not in self.inputs and "stream" in self.inputs

    def request(self, params: GenerationParams, request_id: str) -> InferRequest:
        """The InferRequest for one choice."""
        if self._counts_tokens_here and not params.stream:
            params = replace(params, stream=True)  # the front end joins the pieces
        values = self._vllm(params) if self.vllm else self._trtllm(params)
        req = InferRequest(self.name, "", request_id)
        for name, value in values.items():
            meta = self.inputs.get(name)
            if meta is not None and value is not None:
                req.inputs.append(encode(meta, value if isinstance(value, list) else [value]))
        if params.lora is not None:
            req.parameters["lora_name"] = params.lora
        return req

    def _common(self, p: GenerationParams) -> dict[str, Any]:
        out: dict[str, Any] = {"text_input": p.prompt, "stream": p.stream}
        if self.echo_tensor is not None and p.echo is not None:
            out[self.echo_tensor] = not p.echo
        out["return_num_input_tokens"] = True
        out["return_num_output_tokens"] = True
        return out

    def _trtllm(self, p: GenerationParams) -> dict[str, Any]:
        out = self._common(p)
        out.update(
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            frequency_penalty=p.frequency_penalty,
            presence_penalty=p.presence_penalty,
            seed=p.seed,
            stop_words=p.stop or None,
            lora_name=p.lora,
        )
        if p.guided_json is not None:
            out["guided_decoding_guide_type"] = "json_schema"
            out["guided_decoding_guide"] = p.guided_json
        return out

    def _vllm(self, p: GenerationParams) -> dict[str, Any]:
        out = self._common(p)
        sampling: dict[str, Any] = {"max_tokens": p.max_tokens}
        for key in ("temperature", "top_p", "frequency_penalty", "presence_penalty", "seed"):
            if getattr(p, key) is not None:
                sampling[key] = getattr(p, key)
        if p.stop:
            sampling["stop"] = p.stop
        if p.logprobs is not None:
            sampling["logprobs"] = max(1, p.logprobs)
        if p.lora is not None:
            sampling["lora_name"] = p.lora
        out["sampling_parameters"] = json.dumps(sampling)
        out["return_logprobs"] = p.logprobs is not None
        return out


def encode(meta: TensorMetadata, values: list[Any]) -> InputTensor:
    """`values` as an input of the datatype and shape the model declares (400 when they cannot be)."""
    shape = fit_shape(meta, len(values))
    if meta.datatype == "BYTES":
        data: bytes = serialize_bytes(v.encode() if isinstance(v, str) else v for v in values)
    else:
        dtype = DATATYPE_TO_NUMPY.get(meta.datatype)
        if dtype is None:
            raise invalid_arg(f"input '{meta.name}' of datatype {meta.datatype} cannot take an OpenAI parameter")
        try:
            data = np.asarray(values).astype(dtype).tobytes()
        except (TypeError, ValueError, OverflowError) as e:
            raise invalid_arg(f"input '{meta.name}' cannot take {values!r}: {e}") from None
    return InputTensor(meta.name, meta.datatype, shape, data)


def _first_int(o: Any) -> int | None:
    dtype = DATATYPE_TO_NUMPY.get(o.datatype)
    if dtype is None or o.data is None or element_count(o.shape) < 1 or o.datatype == "BYTES":
        return None
    return int(np.frombuffer(o.data, dtype, count=1)[0])


def parse(response: InferResponse) -> Chunk:
    """The text, token counts and logprobs of one response; raises its error."""
    if response.error is not None:
        raise response.error
    chunk = Chunk(final=response.final)
    for o in response.outputs:
        if o.name == "text_output" and o.data is not None:
            parts = deserialize_bytes(o.data, element_count(o.shape))
            chunk.text = "".join(p.decode("utf-8", "replace") for p in parts)
        elif o.name == "num_input_tokens":
            chunk.prompt_tokens = _first_int(o)
        elif o.name == "num_output_tokens":
            chunk.completion_tokens = _first_int(o)
        elif o.name == "logprobs" and o.data is not None:
            raw = deserialize_bytes(o.data, element_count(o.shape))
            try:
                chunk.logprobs = json.loads(raw[0]) if raw else None
            except ValueError:
                chunk.logprobs = None
    return chunk


def _ranked(position: dict[str, Any]) -> list[dict[str, Any]]:
    """One position of vLLM's logprobs, best rank first."""
    entries = [e for e in position.values() if isinstance(e, dict)]
    return sorted(entries, key=lambda e: e.get("rank") or 1 << 30)


def chat_logprobs(raw: list[Any], top: int) -> list[dict[str, Any]]:
    """vLLM's logprobs as chat completion `logprobs.content`."""
    out = []
    for position in raw:
        ranked = _ranked(position) if isinstance(position, dict) else []
        if not ranked:
            continue

        def item(e: dict[str, Any]) -> dict[str, Any]:
            token = str(e.get("decoded_token", ""))
            return {"token": token, "logprob": e.get("logprob"), "bytes": list(token.encode())}

        out.append({**item(ranked[0]), "top_logprobs": [item(e) for e in ranked[:top]]})
    return out


def completion_logprobs(raw: list[Any], offset: int) -> dict[str, Any]:
    """vLLM's logprobs as a text completion's `logprobs` (text offsets start at `offset`)."""
    tokens: list[str] = []
    token_logprobs: list[Any] = []
    top: list[dict[str, Any]] = []
    offsets: list[int] = []
    for position in raw:
        ranked = _ranked(position) if isinstance(position, dict) else []
        if not ranked:
            continue
        token = str(ranked[0].get("decoded_token", ""))
        offsets.append(offset)
        offset += len(token)
        tokens.append(token)
        token_logprobs.append(ranked[0].get("logprob"))
        top.append({str(e.get("decoded_token", "")): e.get("logprob") for e in ranked})
    return {"text_offset": offsets, "token_logprobs": token_logprobs, "tokens": tokens, "top_logprobs": top}
