"""Model discovery and request payloads: shapes, synthetic or JSON input data, pre-serialized requests.

Input data follows perf_analyzer: `random` or `zero` synthetic data (one data step), or a JSON file
`{"data": [step, ...]}` / `{"data": [[step, ...], ...]}` (one list per stream, streams feed sequences)
where a step maps input names to a flat/nested list, `{"content": [...], "shape": [...]}` or
`{"b64": "..."}`. Shapes exclude the batch dimension; with `-b N` each tensor is tiled N times.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from load.transports.client import ClientError, InferenceClient
from shm.tensor import DATATYPE_TO_NUMPY, element_count, serialize_bytes


class ConfigError(Exception):
    """The requested load does not fit the model or the server (bad name, shape, data, batch size)."""


class PlotError(Exception):
    """A plot could not be made (matplotlib missing, unreadable CSV, unknown latency column)."""


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output as the server describes it (dims exclude the batch dimension)."""

    name: str
    datatype: str
    dims: tuple[int, ...]


@dataclass
class ModelInfo:
    """What the load generator needs to know about the model under test."""

    name: str
    version: str
    max_batch_size: int
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    is_sequence: bool = False
    is_decoupled: bool = False
    server_extensions: set[str] = field(default_factory=set)


def fetch_model_info(client: InferenceClient, name: str, version: str = "") -> ModelInfo:
    """Query metadata and config; raises ConfigError for an unknown or unready model."""
    try:
        meta = client.model_metadata(name, version)
        config = client.model_config(name, version)
    except ClientError as err:
        if err.code in ("NOT_FOUND", "INVALID_ARGUMENT", "UNAVAILABLE"):
            where = f"model '{name}'" + (f" version {version}" if version else "")
            raise ConfigError(f"{where} is not available on {client.url}: {err.message}") from None
        raise
    mbs = int(config.max_batch_size)

    def strip(shape: Sequence[int]) -> tuple[int, ...]:
        dims = tuple(int(d) for d in shape)
        return dims[1:] if mbs > 0 and dims else dims

    try:
        extensions = set(client.server_metadata().extensions)
    except ClientError:
        extensions = set()
    return ModelInfo(
        name=name,
        version=version,
        max_batch_size=mbs,
        inputs=[TensorInfo(t.name, t.datatype, strip(t.shape)) for t in meta.inputs],
        outputs=[TensorInfo(t.name, t.datatype, strip(t.shape)) for t in meta.outputs],
        is_sequence=config.HasField("sequence_batching"),
        is_decoupled=bool(config.model_transaction_policy.decoupled),
        server_extensions=extensions,
    )


def parse_shape_options(options: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Parse `--shape NAME:d1,d2` options (the name may itself contain ':')."""
    shapes: dict[str, tuple[int, ...]] = {}
    for opt in options:
        name, sep, dims = opt.rpartition(":")
        try:
            parsed = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError:
            parsed = ()
        if not sep or not name or not parsed or any(d < 0 for d in parsed):
            raise ConfigError(f"invalid --shape '{opt}': expected NAME:d1,d2,... with non-negative dims")
        shapes[name] = parsed
    return shapes


def resolve_dims(info: ModelInfo, overrides: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Concrete per-input dims (without batch) from model dims and --shape overrides."""
    known = {t.name for t in info.inputs}
    for name in overrides:
        if name not in known:
            raise ConfigError(f"--shape names '{name}', which is not an input of model '{info.name}'")
    dims: dict[str, tuple[int, ...]] = {}
    for t in info.inputs:
        if t.name in overrides:
            shape = overrides[t.name]
            if len(shape) != len(t.dims) or any(m >= 0 and m != s for m, s in zip(t.dims, shape, strict=True)):
                raise ConfigError(
                    f"--shape {t.name}:{','.join(map(str, shape))} does not fit model '{info.name}', "
                    f"which expects {list(t.dims)} for that input"
                )
            dims[t.name] = shape
        elif any(d < 0 for d in t.dims):
            dims[t.name] = ()  # resolved from JSON data, or an error later
        else:
            dims[t.name] = t.dims
    return dims


def check_batch_size(info: ModelInfo, batch_size: int) -> None:
    """perf_analyzer's rule: batch > 1 needs a batching model, and at most max_batch_size."""
    if batch_size < 1:
        raise ConfigError("batch size (-b) must be at least 1")
    if info.max_batch_size == 0 and batch_size > 1:
        raise ConfigError(f"model '{info.name}' does not support batching; -b must be 1")
    if info.max_batch_size > 0 and batch_size > info.max_batch_size:
        raise ConfigError(
            f"batch size {batch_size} is larger than max_batch_size {info.max_batch_size} of model '{info.name}'"
        )


# A data step: input name -> (dims without batch, serialized bytes of ONE batch item).
Step = dict[str, tuple[tuple[int, ...], bytes]]


def synthetic_steps(
    info: ModelInfo,
    dims: Mapping[str, tuple[int, ...]],
    kind: str,
    string_length: int = 128,
    string_data: str | None = None,
    seed: int = 0,
) -> list[list[Step]]:
    """One stream with one step of `random` or `zero` data for every input."""
    rng = np.random.default_rng(seed)
    step: Step = {}
    for t in info.inputs:
        shape = dims[t.name]
        if any(d < 0 for d in t.dims) and not shape:
            raise ConfigError(
                f"input '{t.name}' of model '{info.name}' has variable dims {list(t.dims)}; "
                f"give a concrete shape with --shape {t.name}:..."
            )
        step[t.name] = (shape, _synthetic_tensor(t.datatype, shape, kind, rng, string_length, string_data))
    return [[step]]


def _synthetic_tensor(
    datatype: str,
    shape: tuple[int, ...],
    kind: str,
    rng: np.random.Generator,
    string_length: int,
    string_data: str | None,
) -> bytes:
    count = element_count(shape)
    if datatype == "BYTES":
        if string_data is not None:
            items = [string_data.encode()] * count
        elif kind == "zero":
            items = [b"0" * string_length] * count
        else:
            letters = rng.integers(ord("a"), ord("z") + 1, size=(count, string_length), dtype=np.uint8)
            items = [row.tobytes() for row in letters]
        return serialize_bytes(items)
    if datatype == "BF16":
        if kind == "zero":
            return bytes(2 * count)
        floats = rng.random(count, dtype=np.float32)
        return (floats.view(np.uint32) >> 16).astype("<u2").tobytes()
    if datatype not in DATATYPE_TO_NUMPY:
        raise ConfigError(f"unsupported datatype {datatype}")
    dtype = DATATYPE_TO_NUMPY[datatype].newbyteorder("<")
    if kind == "zero":
        return np.zeros(count, dtype=dtype).tobytes()
    if dtype.kind == "b":
        return rng.integers(0, 2, size=count).astype(dtype).tobytes()
    if dtype.kind == "f":
        return rng.random(count).astype(dtype).tobytes()
    return rng.integers(0, 100, size=count).astype(dtype).tobytes()


def json_steps(info: ModelInfo, dims: Mapping[str, tuple[int, ...]], path: str) -> list[list[Step]]:
    """Streams of steps from a perf_analyzer-style JSON data file."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read input data file '{path}': {err}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list) or not data:
        raise ConfigError(f"input data file '{path}' needs a non-empty \"data\" list")
    raw_streams = data if all(isinstance(s, list) for s in data) else [data]
    streams: list[list[Step]] = []
    for si, raw_steps in enumerate(raw_streams):
        steps: list[Step] = []
        for pi, raw in enumerate(raw_steps):
            if not isinstance(raw, dict):
                raise ConfigError(f"input data file '{path}': stream {si} step {pi} is not an object")
            step: Step = {}
            for t in info.inputs:
                if t.name not in raw:
                    raise ConfigError(f"input data file '{path}': stream {si} step {pi} lacks input '{t.name}'")
                where = f"'{path}' stream {si} step {pi} input '{t.name}'"
                step[t.name] = _json_tensor(t, dims[t.name], raw[t.name], where)
            steps.append(step)
        if not steps:
            raise ConfigError(f"input data file '{path}': stream {si} is empty")
        streams.append(steps)
    return streams


def _json_tensor(t: TensorInfo, dims: tuple[int, ...], value: Any, where: str) -> tuple[tuple[int, ...], bytes]:
    shape = dims
    if isinstance(value, dict) and "shape" in value:
        shape = tuple(int(d) for d in value["shape"])
    if isinstance(value, dict) and "b64" in value:
        payload = base64.b64decode(value["b64"])
        if not shape:
            raise ConfigError(f"{where}: b64 data needs a shape (in the data or via --shape)")
        return shape, payload
    content = value["content"] if isinstance(value, dict) else value
    flat = np.asarray(content, dtype=object).reshape(-1).tolist()
    if not shape:
        if len(t.dims) == 1:
            shape = (len(flat),)
        else:
            raise ConfigError(f'{where}: variable dims {list(t.dims)} need a "shape" or --shape')
    if len(shape) != len(t.dims) or any(m >= 0 and m != s for m, s in zip(t.dims, shape, strict=True)):
        raise ConfigError(f"{where}: shape {list(shape)} does not fit model dims {list(t.dims)}")
    if len(flat) != element_count(shape):
        raise ConfigError(f"{where}: {len(flat)} values do not fill shape {list(shape)}")
    if t.datatype == "BYTES":
        return shape, serialize_bytes(v if isinstance(v, bytes) else str(v) for v in flat)
    if t.datatype not in DATATYPE_TO_NUMPY:
        raise ConfigError(f"{where}: datatype {t.datatype} cannot be given as JSON")
    try:
        arr = np.asarray(flat, dtype=DATATYPE_TO_NUMPY[t.datatype].newbyteorder("<"))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from None
    return shape, arr.tobytes()


def batched(step: Step, batch_size: int, max_batch_size: int) -> dict[str, tuple[tuple[int, ...], bytes]]:
    """Request shapes (with the batch dim when the model batches) and bytes tiled `batch_size` times."""
    out: dict[str, tuple[tuple[int, ...], bytes]] = {}
    for name, (dims, data) in step.items():
        if max_batch_size > 0:
            out[name] = ((batch_size, *dims), data * batch_size)
        else:
            out[name] = (dims, data)
    return out
