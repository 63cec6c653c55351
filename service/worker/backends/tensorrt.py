"""The TensorRT backend (platform tensorrt_plan): a serialized engine run on a CUDA stream with cupy buffers.

Inputs that arrive in CUDA shared memory come in as cupy arrays over the client's allocation (device_inputs)
and are bound without a host copy when a request is alone in its batch; several requests are gathered into
one device buffer with device-to-device copies. Needs a CUDA GPU, the `tensorrt` package and cupy.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from service.ipc.devices import visible_gpu_count
from service.worker.backends.base import (
    BackendContext,
    BackendError,
    BatchingBackend,
    check_tensor,
)

log = logging.getLogger("trireme.worker.tensorrt")

# tensorrt.DataType member names -> config data types
TRT_TYPES: dict[str, str] = {
    "FLOAT": "TYPE_FP32",
    "HALF": "TYPE_FP16",
    "BF16": "TYPE_BF16",
    "INT8": "TYPE_INT8",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
}


def _require_gpu(model: str) -> tuple[Any, Any]:
    """(tensorrt, cupy) modules, or a BackendError saying what is missing."""
    if visible_gpu_count() == 0:
        raise BackendError(
            f"unable to load model '{model}': the tensorrt backend needs a CUDA GPU and none is visible on this machine"
        )
    try:
        import cupy
        import tensorrt
    except ImportError as e:
        raise BackendError(
            f"unable to load model '{model}': the tensorrt backend needs the 'tensorrt' and 'cupy' packages ({e})"
        ) from None
    return tensorrt, cupy


def _load_engine(trt: Any, path: str, model: str) -> Any:
    if not os.path.isfile(path):
        raise BackendError(f"unable to load model '{model}': unable to find '{path}'")
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    with open(path, "rb") as f:
        engine = runtime.deserialize_cuda_engine(f.read())
    if engine is None:
        raise BackendError(f"unable to load model '{model}': failed to deserialize the TensorRT engine '{path}'")
    return engine


def engine_io(trt: Any, engine: Any) -> list[tuple[str, bool, str, list[int]]]:
    """(name, is_input, config type, shape with -1 for dynamic dims) of every I/O tensor of the engine."""
    out = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        dtype = engine.get_tensor_dtype(name)
        out.append(
            (name, is_input, TRT_TYPES.get(dtype.name, f"TYPE_{dtype.name}"), list(engine.get_tensor_shape(name)))
        )
    return out


def profile_max_batch(engine: Any, inputs: list[str]) -> int:
    """The largest first dimension optimization profile 0 accepts for every input (0 when fixed)."""
    best = None
    for name in inputs:
        if engine.get_tensor_shape(name)[0] != -1:
            return 0
        _min, _opt, max_shape = engine.get_tensor_profile_shape(name, 0)
        best = max_shape[0] if best is None else min(best, max_shape[0])
    return int(best or 0)


class TensorRTBackend(BatchingBackend):
    """Backend for `platform: "tensorrt_plan"` / `backend: "tensorrt"` models (KIND_GPU instances)."""

    device_inputs = True

    def __init__(self, context: BackendContext) -> None:
        super().__init__(context)
        self.trt: Any = None
        self.cupy: Any = None
        self.engine: Any = None
        self.exec_context: Any = None
        self.stream: Any = None
        self.dtypes: dict[str, Any] = {}  # tensor name -> numpy dtype
        self.output_names = [t["name"] for t in self.config_outputs]

    @classmethod
    def auto_complete(cls, config: dict[str, Any], model_dir: str, version_dir: str) -> dict[str, Any]:
        """Fill inputs/outputs from the engine; max_batch_size from profile 0 when the first dims are dynamic."""
        name = config.get("name") or os.path.basename(model_dir)
        trt, _cupy = _require_gpu(name)
        engine = _load_engine(
            trt, os.path.join(version_dir, config.get("default_model_filename") or "model.plan"), name
        )
        io = engine_io(trt, engine)
        config = dict(config)
        max_batch_size = int(config.get("max_batch_size", 0) or 0)
        if not config.get("input") and not config.get("output") and max_batch_size == 0:
            max_batch_size = profile_max_batch(engine, [n for n, is_in, _, _ in io if is_in])
            config["max_batch_size"] = max_batch_size
            if max_batch_size > 1 and not any(
                k in config for k in ("dynamic_batching", "sequence_batching", "ensemble_scheduling")
            ):
                config["dynamic_batching"] = {}
        skip = 1 if max_batch_size > 0 else 0
        for key, want_input in (("input", True), ("output", False)):
            if not config.get(key):
                config[key] = [
                    {"name": n, "data_type": t, "dims": shape[skip:]}
                    for n, is_in, t, shape in io
                    if is_in == want_input
                ]
        return config

    def initialize(self) -> None:
        """Deserialize the engine on the instance's GPU, check the config against it, create the stream."""
        ctx = self.context
        if ctx.instance_kind not in ("GPU", "MODEL") and visible_gpu_count() > 0:
            raise BackendError(
                f"unable to load model '{ctx.model_name}': the tensorrt backend only supports KIND_GPU instance groups"
            )
        self.trt, self.cupy = _require_gpu(ctx.model_name)
        self.cupy.cuda.Device(ctx.device_id).use()
        path = os.path.join(ctx.version_dir, ctx.config.get("default_model_filename") or "model.plan")
        self.engine = _load_engine(self.trt, path, ctx.model_name)
        self.exec_context = self.engine.create_execution_context()
        self.stream = self.cupy.cuda.Stream(non_blocking=True)
        io = {n: (is_in, t, shape) for n, is_in, t, shape in engine_io(self.trt, self.engine)}
        for kind, tensors, want_input in (("input", self.config_inputs, True), ("output", self.config_outputs, False)):
            for t in tensors:
                found = io.get(t["name"])
                if found is None or found[0] != want_input:
                    allowed = ", ".join(n for n, v in io.items() if v[0] == want_input)
                    raise BackendError(
                        f"unable to load model '{ctx.model_name}', unexpected inference {kind} '{t['name']}', "
                        f"allowed {kind}s are: {allowed}"
                    )
                check_tensor(
                    ctx.model_name,
                    kind,
                    t["name"],
                    t.get("data_type", ""),
                    [int(d) for d in t.get("dims", [])],
                    found[1],
                    found[2],
                    self.max_batch_size,
                )
                self.dtypes[t["name"]] = np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(t["name"])))
        if self.max_batch_size > 0:
            limit = profile_max_batch(self.engine, [t["name"] for t in self.config_inputs])
            if limit and self.max_batch_size > limit:
                raise BackendError(
                    f"unable to load model '{ctx.model_name}', configuration specified max_batch_size "
                    f"{self.max_batch_size} but the engine's optimization profile 0 supports at most {limit}"
                )

    def gather(self, name: str, parts: list[Any]) -> Any:
        """One device buffer for the group: device parts are used in place (alone) or copied device-to-device."""
        cp = self.cupy
        first = parts[0]
        with self.stream:
            if len(parts) == 1:
                if isinstance(first, cp.ndarray):
                    return first if first.flags.c_contiguous else cp.ascontiguousarray(first)
                return cp.asarray(np.ascontiguousarray(first))
            rows = sum(int(p.shape[0]) for p in parts)
            buf = cp.empty((rows, *first.shape[1:]), dtype=first.dtype)
            pos = 0
            for part in parts:
                n = int(part.shape[0])
                if isinstance(part, cp.ndarray):
                    buf[pos : pos + n] = part
                else:
                    buf[pos : pos + n].set(np.ascontiguousarray(part), stream=self.stream)
                pos += n
        return buf

    def run(self, inputs: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
        """Set input shapes and addresses, enqueue the engine on the stream, copy the outputs to the host."""
        cp = self.cupy
        ectx = self.exec_context
        model = self.context.model_name
        for name, array in inputs.items():
            expected = self.dtypes.get(name)
            if expected is not None and array.dtype != expected:
                array = inputs[name] = array.astype(expected)
            if not ectx.set_input_shape(name, tuple(int(d) for d in array.shape)):
                raise BackendError(
                    f"model '{model}': input '{name}' shape {list(array.shape)} is outside the engine's optimization "
                    "profile"
                )
            ectx.set_tensor_address(name, int(array.data.ptr))
        outputs: dict[str, Any] = {}
        with self.stream:
            for name in self.output_names:
                shape = tuple(int(d) for d in ectx.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise BackendError(f"model '{model}': output '{name}' has a data-dependent shape {list(shape)}")
                buf = cp.empty(shape, dtype=self.dtypes[name])
                ectx.set_tensor_address(name, int(buf.data.ptr))
                outputs[name] = buf
            if not ectx.execute_async_v3(self.stream.ptr):
                raise BackendError(f"model '{model}': TensorRT failed to enqueue the inference")
            host = {name: cp.asnumpy(buf, stream=self.stream) for name, buf in outputs.items()}
        self.stream.synchronize()
        return host

    def finalize(self) -> None:
        """Drop the execution context and engine before the CUDA context goes away."""
        self.exec_context = None
        self.engine = None
