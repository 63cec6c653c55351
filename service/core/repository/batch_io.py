"""Checks of a config's `batch_input` and `batch_output` entries, with Triton's messages (ragged batching)."""

from __future__ import annotations

from protos import model_config_pb2 as mc
from service.errors import ErrorCode, ServiceError


def validate_batch_io(config: mc.ModelConfig) -> None:
    """ServiceError INVALID_ARG, "<Triton's message> for <model>", when a batch input or output is malformed."""
    problem = _problem(config)
    if problem:
        raise ServiceError(ErrorCode.INVALID_ARG, f"{problem} for {config.name}")


def _problem(config: mc.ModelConfig) -> str:
    inputs = {t.name for t in config.input}
    outputs = {t.name for t in config.output}
    for bi in config.batch_input:
        kind = mc.BatchInput.Kind.Name(bi.kind)
        if len(bi.source_input) != 1:
            return f"batch input kind '{kind}' expects 1 source input, got {len(bi.source_input)}"
        if bi.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
            return "batch input data type must be TYPE_INT32 or TYPE_FP32"
        for name in bi.source_input:
            if name not in inputs:
                return f"unknown source input name '{name}'"
    for bo in config.batch_output:
        kind = mc.BatchOutput.Kind.Name(bo.kind)
        if len(bo.source_input) != 1:
            return f"batch output kind '{kind}' expects 1 source input, got {len(bo.source_input)}"
        for name in bo.source_input:
            if name not in inputs:
                return f"unknown source input name '{name}'"
        seen: set[str] = set()
        for name in bo.target_name:
            if name not in outputs:
                return f"unknown target output name '{name}'"
            if name in seen:
                return f"target output name '{name}' can only be specified once"
            seen.add(name)
    return ""
