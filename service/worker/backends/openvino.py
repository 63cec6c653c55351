"""Triton's OpenVINO backend (`backend: "openvino"`): an OpenVINO IR (`model.xml` + `model.bin`) or any file
OpenVINO reads (`model.onnx`), compiled for the CPU by the `openvino` runtime package.

Parameters as in Triton's openvino backend: `PERFORMANCE_HINT` (LATENCY / THROUGHPUT), `INFERENCE_NUM_THREADS`,
`COMPILATION_NUM_THREADS`, `NUM_STREAMS`, `HINT_BF16`, `SKIP_OV_DYNAMIC_BATCHSIZE` (compile for exactly
max_batch_size rows) with `ENABLE_BATCH_PADDING` (pad smaller batches instead of failing them).
`OpenVINOModel` is also what the onnxruntime backend runs an ONNX model on when its config asks for the
`openvino` CPU accelerator and the installed onnxruntime has no OpenVINOExecutionProvider.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from service.worker.backends.base import (
    DEFAULT_MAX_BATCH_SIZE,
    BackendContext,
    BackendError,
    BatchingBackend,
    check_tensor,
    config_parameter,
    default_thread_count,
)

# OpenVINO element type names -> config data types
OV_TYPES: dict[str, str] = {
    "boolean": "TYPE_BOOL",
    "u8": "TYPE_UINT8",
    "u16": "TYPE_UINT16",
    "u32": "TYPE_UINT32",
    "u64": "TYPE_UINT64",
    "i8": "TYPE_INT8",
    "i16": "TYPE_INT16",
    "i32": "TYPE_INT32",
    "i64": "TYPE_INT64",
    "f16": "TYPE_FP16",
    "f32": "TYPE_FP32",
    "f64": "TYPE_FP64",
    "bf16": "TYPE_BF16",
    "string": "TYPE_STRING",
}

Tensors = list[tuple[str, str, list[int]]]


def openvino_module() -> Any:
    """The `openvino` package, or a BackendError naming what to install."""
    try:
        import openvino
    except ImportError as e:
        raise BackendError(
            f"OpenVINO is not installed ({e}); install it with: pip install 'trireme[openvino]' (the 'openvino' "
            "package)"
        ) from None
    return openvino


def model_path(version_dir: str, filename: str) -> str:
    """<version_dir>/<filename or model.xml>."""
    return os.path.join(version_dir, filename or "model.xml")


def _describe(ports: Any) -> Tensors:
    out = []
    for port in ports:
        shape = [d.get_length() if d.is_static else -1 for d in port.get_partial_shape()]
        names = port.get_names()
        name = port.get_any_name() if names else f"{port.get_node().get_friendly_name()}"
        out.append((name, OV_TYPES.get(port.get_element_type().get_type_name(), "TYPE_INVALID"), shape))
    return out


class OpenVINOModel:
    """One compiled OpenVINO model on the CPU with its infer request; config names map to the model's ports."""

    def __init__(self, path: str, model_name: str, options: dict[str, Any], batch: int = 0) -> None:
        """Read `path`; batch > 0 makes every input's first dimension dynamic (-1) or, as a negative number, fixes it
        to -batch rows (SKIP_OV_DYNAMIC_BATCHSIZE); then compile with `options` (OpenVINO properties)."""
        ov = openvino_module()
        self.model_name = model_name
        if not os.path.isfile(path):
            raise BackendError(f"unable to load model '{model_name}': unable to find '{path}'")
        core = ov.Core()
        try:
            model = core.read_model(path)
        except Exception as e:
            raise BackendError(f"unable to load model '{model_name}': OpenVINO could not read '{path}': {e}") from None
        if batch:
            shapes = {}
            for port in model.inputs:
                shape = port.get_partial_shape()
                if shape.rank.is_static and len(shape) > 0:
                    shape[0] = ov.Dimension(-1) if batch > 0 else ov.Dimension(-batch)
                    shapes[port] = shape
            try:
                model.reshape(shapes)
            except Exception as e:
                raise BackendError(
                    f"unable to load model '{model_name}': its inputs cannot take a batch dimension ({e}); set "
                    "max_batch_size: 0, or SKIP_OV_DYNAMIC_BATCHSIZE to YES"
                ) from None
        self.inputs = _describe(model.inputs)
        self.outputs = _describe(model.outputs)
        try:
            self.compiled = core.compile_model(model, "CPU", options)
        except Exception as e:
            raise BackendError(f"unable to load model '{model_name}': OpenVINO could not compile it: {e}") from None
        self.request = self.compiled.create_infer_request()
        self.output_index = {name: i for i, (name, _, _) in enumerate(self.outputs)}

    def infer(self, feed: dict[str, np.ndarray], output_names: list[str]) -> list[np.ndarray]:
        """Run one inference; outputs are copies (the request's buffers are reused by the next call)."""
        self.request.infer(feed, share_inputs=True, share_outputs=False)
        return [np.array(self.request.get_output_tensor(self.output_index[n]).data) for n in output_names]


def properties(config: dict[str, Any]) -> dict[str, Any]:
    """OpenVINO compile properties from Triton's openvino backend parameters (threads default to this instance's
    share of the cores)."""
    props: dict[str, Any] = {}
    threads = config_parameter(config, "INFERENCE_NUM_THREADS", "")
    props["INFERENCE_NUM_THREADS"] = int(threads) if threads.strip() else default_thread_count(config)
    for key in ("COMPILATION_NUM_THREADS", "NUM_STREAMS", "PERFORMANCE_HINT"):
        value = config_parameter(config, key, "").strip()
        if value:
            props[key] = value
    # OpenVINO computes in bf16 by default on CPUs with native bf16 (this AMD EPYC too): answers then differ from the
    # model's in the 3rd digit. Full precision unless HINT_BF16 asks for bf16.
    bf16 = config_parameter(config, "HINT_BF16", "").strip().upper() == "YES"
    props["INFERENCE_PRECISION_HINT"] = "bf16" if bf16 else "f32"
    return props


def check_io(model_name: str, config: dict[str, Any], inputs: Tensors, outputs: Tensors) -> None:
    """Every config tensor must exist in the model with the same data type and compatible dims (Triton's words)."""
    max_batch_size = int(config.get("max_batch_size", 0) or 0)
    for kind, tensors in (("input", inputs), ("output", outputs)):
        by_name = {n: (t, s) for n, t, s in tensors}
        for t in config.get(kind, []):
            found = by_name.get(t["name"])
            if found is None:
                raise BackendError(
                    f"unable to load model '{model_name}', unexpected inference {kind} '{t['name']}', allowed "
                    f"{kind}s are: {', '.join(by_name)}"
                )
            dims = [int(d) for d in t.get("dims", [])]
            check_tensor(model_name, kind, t["name"], t.get("data_type", ""), dims, found[0], found[1], max_batch_size)


class OpenVINOBackend(BatchingBackend):
    """Backend for `backend: "openvino"` models."""

    def __init__(self, context: BackendContext) -> None:
        super().__init__(context)
        self.model: OpenVINOModel | None = None
        self.output_names: list[str] = [t["name"] for t in self.config_outputs]
        self.fixed_batch = 0  # SKIP_OV_DYNAMIC_BATCHSIZE: the model runs exactly this many rows
        self.pad = False

    @classmethod
    def auto_complete(cls, config: dict[str, Any], model_dir: str, version_dir: str) -> dict[str, Any]:
        """Fill inputs, outputs and (for a model whose first dimensions are dynamic) max_batch_size from the model."""
        name = config.get("name") or os.path.basename(model_dir)
        model = OpenVINOModel(model_path(version_dir, config.get("default_model_filename", "")), name, {})
        config = dict(config)
        io = model.inputs + model.outputs
        had_tensors = bool(config.get("input")) or bool(config.get("output"))
        batching = bool(io) and all(shape and shape[0] == -1 for _, _, shape in io)
        max_batch_size = int(config.get("max_batch_size", 0) or 0)
        if not had_tensors and max_batch_size == 0 and batching:
            max_batch_size = config["max_batch_size"] = DEFAULT_MAX_BATCH_SIZE
            if not any(k in config for k in ("dynamic_batching", "sequence_batching", "ensemble_scheduling")):
                config["dynamic_batching"] = {}
        skip = 1 if max_batch_size > 0 else 0
        for key, tensors in (("input", model.inputs), ("output", model.outputs)):
            if not config.get(key):
                config[key] = [{"name": n, "data_type": t, "dims": shape[skip:]} for n, t, shape in tensors]
        return config

    def initialize(self) -> None:
        """Read and compile the model for the CPU and check the config against it."""
        ctx = self.context
        config = ctx.config
        if ctx.instance_kind == "GPU":
            raise BackendError(f"model '{ctx.model_name}': the openvino backend runs on CPU instances (KIND_CPU)")
        batch = self.max_batch_size
        if batch and config_parameter(config, "SKIP_OV_DYNAMIC_BATCHSIZE", "").strip().upper() == "YES":
            self.fixed_batch = batch
            self.pad = config_parameter(config, "ENABLE_BATCH_PADDING", "").strip().upper() == "YES"
            batch = -batch
        try:
            options = properties(config)
        except ValueError as e:
            raise BackendError(f"unable to load model '{ctx.model_name}': bad parameter value: {e}") from None
        path = model_path(ctx.version_dir, config.get("default_model_filename", ""))
        self.model = OpenVINOModel(path, ctx.model_name, options, batch)
        inputs, outputs = self.model.inputs, self.model.outputs
        if self.fixed_batch:  # the check expects a dynamic batch dimension
            inputs = [(n, t, [-1, *s[1:]]) for n, t, s in inputs]
            outputs = [(n, t, [-1, *s[1:]] if s else s) for n, t, s in outputs]
        check_io(ctx.model_name, config, inputs, outputs)

    def run(self, inputs: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
        """One inference over the gathered rows (padded to the fixed batch when SKIP_OV_DYNAMIC_BATCHSIZE is set)."""
        assert self.model is not None
        if self.fixed_batch and rows != self.fixed_batch:
            if not self.pad or rows > self.fixed_batch:
                raise BackendError(
                    f"model '{self.context.model_name}' runs batches of exactly {self.fixed_batch} rows "
                    f"(SKIP_OV_DYNAMIC_BATCHSIZE); got {rows} (set ENABLE_BATCH_PADDING to YES to pad)"
                )
            inputs = {
                n: np.concatenate([a, np.zeros((self.fixed_batch - rows, *a.shape[1:]), a.dtype)])
                for n, a in inputs.items()
            }
        results = self.model.infer(inputs, self.output_names)
        if self.fixed_batch and rows != self.fixed_batch:
            results = [r[:rows] for r in results]
        return dict(zip(self.output_names, results, strict=True))
