"""The ONNX Runtime backend (platform onnxruntime_onnx): one InferenceSession per model instance."""

from __future__ import annotations

import logging
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

log = logging.getLogger("trireme.worker.onnxruntime")


# onnxruntime's type strings -> config data types
ORT_TYPES: dict[str, str] = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(bfloat16)": "TYPE_BF16",
    "tensor(string)": "TYPE_STRING",
}


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError as e:
        raise BackendError(
            f"the onnxruntime backend needs the 'onnxruntime' package, which is not installed ({e})"
        ) from None
    return onnxruntime


def model_path(version_dir: str, filename: str) -> str:
    """<version_dir>/<filename>, or <that dir>/model.onnx when the model is a directory (external data)."""
    path = os.path.join(version_dir, filename or "model.onnx")
    if os.path.isdir(path):
        path = os.path.join(path, "model.onnx")
    return path


def model_io(session: Any) -> tuple[list[tuple[str, str, list[int]]], list[tuple[str, str, list[int]]]]:
    """(inputs, outputs) of a session as (name, config type, shape with -1 for dynamic dims)."""

    def describe(args: Any) -> list[tuple[str, str, list[int]]]:
        out = []
        for a in args:
            shape = [d if isinstance(d, int) and d >= 0 else -1 for d in (a.shape or [])]
            out.append((a.name, ORT_TYPES.get(a.type, a.type), shape))
        return out

    return describe(session.get_inputs()), describe(session.get_outputs())


def _open(path: str, model: str) -> Any:
    ort = _ort()
    if not os.path.isfile(path):
        raise BackendError(f"unable to load model '{model}': unable to find '{path}'")
    try:
        return ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise BackendError(f"unable to load model '{model}' from '{path}': {e}") from None


class OnnxBackend(BatchingBackend):
    """Backend for `platform: "onnxruntime_onnx"` / `backend: "onnxruntime"` models."""

    def __init__(self, context: BackendContext) -> None:
        super().__init__(context)
        self.session: Any = None
        self.output_names: list[str] = [t["name"] for t in self.config_outputs]
        self.string_inputs: set[str] = set()
        self.wants_openvino = False
        self.openvino: Any = None  # an OpenVINOModel when OpenVINO runs the model itself

    @classmethod
    def auto_complete(cls, config: dict[str, Any], model_dir: str, version_dir: str) -> dict[str, Any]:
        """Fill inputs, outputs and (for a model with a dynamic first dimension) max_batch_size from the model."""
        name = config.get("name") or os.path.basename(model_dir)
        session = _open(model_path(version_dir, config.get("default_model_filename", "")), name)
        inputs, outputs = model_io(session)
        config = dict(config)
        had_tensors = bool(config.get("input")) or bool(config.get("output"))
        batching = bool(inputs or outputs) and all(shape and shape[0] == -1 for _, _, shape in inputs + outputs)
        max_batch_size = int(config.get("max_batch_size", 0) or 0)
        if not had_tensors and max_batch_size == 0 and batching:
            max_batch_size = config["max_batch_size"] = DEFAULT_MAX_BATCH_SIZE
            if not any(k in config for k in ("dynamic_batching", "sequence_batching", "ensemble_scheduling")):
                config["dynamic_batching"] = {}
        skip = 1 if max_batch_size > 0 else 0
        for key, tensors in (("input", inputs), ("output", outputs)):
            if not config.get(key):
                config[key] = [{"name": n, "data_type": t, "dims": shape[skip:]} for n, t, shape in tensors]
        return config

    def initialize(self) -> None:
        """Create the session (providers from the instance kind and accelerators) and check the config."""
        ort = _ort()
        ctx = self.context
        config = ctx.config
        path = model_path(ctx.version_dir, config.get("default_model_filename", ""))
        if not os.path.isfile(path):
            raise BackendError(f"unable to load model '{ctx.model_name}': unable to find '{path}'")
        options = ort.SessionOptions()
        intra = int(config_parameter(config, "intra_op_thread_count", "0") or 0)
        inter = int(config_parameter(config, "inter_op_thread_count", "0") or 0)
        options.intra_op_num_threads = intra if intra > 0 else default_thread_count(config)
        if inter > 0:
            options.inter_op_num_threads = inter
        level = int(config.get("optimization", {}).get("graph", {}).get("level", 0) or 0)
        options.graph_optimization_level = (
            ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            if level < 0
            else ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
            if level == 1
            else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        )
        available = ort.get_available_providers()
        providers = self._providers(available)
        if self.wants_openvino:
            try:
                route = openvino_route(ort, options, available)
            except BackendError as e:
                raise BackendError(f"unable to load model '{ctx.model_name}': {e}") from None
            if route == "runtime":  # no OpenVINO EP in this onnxruntime: OpenVINO runs the whole ONNX model
                from service.worker.backends.openvino import OpenVINOModel, properties

                props = {**properties(config), "INFERENCE_NUM_THREADS": options.intra_op_num_threads}
                self.openvino = OpenVINOModel(path, ctx.model_name, props, self.max_batch_size)
                log.info(
                    "model '%s': the OpenVINO runtime compiled the ONNX model (openvino accelerator)", ctx.model_name
                )
                self._check_config()
                return
            if route == "provider":
                providers.insert(0, ("OpenVINOExecutionProvider", {"device_type": "CPU"}))
            # "plugin": the OpenVINO EP plugin is already in `options` (add_provider_for_devices)
        try:
            self.session = ort.InferenceSession(path, sess_options=options, providers=providers)
        except Exception as e:
            raise BackendError(f"unable to load model '{ctx.model_name}' from '{path}': {e}") from None
        self._check_config()

    def _providers(self, available: list[str]) -> list[Any]:
        ctx = self.context
        accelerators = self.context.config.get("optimization", {}).get("execution_accelerators", {})
        wanted: list[Any] = []
        if ctx.instance_kind == "GPU":
            for acc in accelerators.get("gpu_execution_accelerator", []):
                if acc.get("name") == "tensorrt":
                    wanted.append(("TensorrtExecutionProvider", {"device_id": ctx.device_id}))
                elif acc.get("name") == "cuda":
                    continue
                else:
                    raise BackendError(
                        f"model '{ctx.model_name}': unknown gpu_execution_accelerator '{acc.get('name')}'"
                    )
            wanted.append(("CUDAExecutionProvider", {"device_id": ctx.device_id}))
        for acc in accelerators.get("cpu_execution_accelerator", []):
            if acc.get("name") == "openvino":
                self.wants_openvino = True  # placed by openvino_route
            else:
                raise BackendError(f"model '{ctx.model_name}': unknown cpu_execution_accelerator '{acc.get('name')}'")
        for provider in wanted:
            pname = provider[0] if isinstance(provider, tuple) else provider
            if pname not in available:
                raise BackendError(
                    f"model '{ctx.model_name}': instance '{ctx.instance_name}' needs onnxruntime's {pname}, which "
                    f"this onnxruntime build does not have (available: {', '.join(available)})"
                )
        return [*wanted, "CPUExecutionProvider"]

    def _check_config(self) -> None:
        """Every config tensor must exist in the model with the same data type and compatible dims."""
        model = self.context.model_name
        inputs, outputs = (self.openvino.inputs, self.openvino.outputs) if self.openvino else model_io(self.session)
        for kind, config_tensors, model_tensors in (
            ("input", self.config_inputs, inputs),
            ("output", self.config_outputs, outputs),
        ):
            by_name = {n: (t, s) for n, t, s in model_tensors}
            for t in config_tensors:
                found = by_name.get(t["name"])
                if found is None:
                    raise BackendError(
                        f"unable to load model '{model}', unexpected inference {kind} '{t['name']}', allowed "
                        f"{kind}s are: {', '.join(by_name)}"
                    )
                if kind == "output" and t["name"] in self.scatter_outputs:  # shaped by the batch: type only
                    if t.get("data_type", "") != found[0]:
                        raise BackendError(
                            f"unable to load model '{model}', configuration expects datatype {t.get('data_type')} "
                            f"for output '{t['name']}', model provides {found[0]}"
                        )
                    continue
                ragged = kind == "input" and t["name"] in self.ragged  # the model takes it as one 1-D tensor
                check_tensor(
                    model,
                    kind,
                    t["name"],
                    t.get("data_type", ""),
                    [-1] if ragged else [int(d) for d in t.get("dims", [])],
                    found[0],
                    found[1],
                    0 if ragged else self.max_batch_size,
                )
                if kind == "input" and found[0] == "TYPE_STRING":
                    self.string_inputs.add(t["name"])
        by_input = {n: t for n, t, _ in inputs}
        for spec in self.batch_input_specs:
            for target in spec.get("target_name", []):
                if target not in by_input:
                    raise BackendError(
                        f"unable to load model '{model}', batch input '{target}' is not an input of the model, "
                        f"allowed inputs are: {', '.join(by_input)}"
                    )
                if by_input[target] != spec.get("data_type"):
                    raise BackendError(
                        f"unable to load model '{model}', configuration expects datatype {spec.get('data_type')} "
                        f"for batch input '{target}', model provides {by_input[target]}"
                    )
        required = set(by_input)
        configured = set(self.model_input_names())
        missing = sorted(required - configured)
        if missing:
            raise BackendError(
                f"unable to load model '{model}', the model's inputs {missing} are not in the configuration"
            )

    def run(self, inputs: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
        """session.run over the gathered inputs (BYTES inputs as str objects, as onnxruntime wants them)."""
        feed = inputs
        if self.string_inputs:
            feed = dict(inputs)
            for name in self.string_inputs & feed.keys():
                feed[name] = np.vectorize(_to_str, otypes=[object])(feed[name])
        if self.openvino is not None:
            results = self.openvino.infer(feed, self.output_names)
        else:
            results = self.session.run(self.output_names, feed)
        return dict(zip(self.output_names, results, strict=True))


def openvino_route(ort: Any, options: Any, available: list[str]) -> str:
    """How this worker runs the `openvino` CPU accelerator, best first: "provider" (an onnxruntime build with
    OpenVINOExecutionProvider, e.g. onnxruntime-openvino), "plugin" (the onnxruntime-ep-openvino plugin, added to
    `options`; it offers devices on Intel CPUs only), "runtime" (the `openvino` package compiles the whole ONNX
    model). BackendError naming what to install when none is there."""
    if "OpenVINOExecutionProvider" in available:
        return "provider"
    try:
        import onnxruntime_ep_openvino as plugin

        name = plugin.get_ep_name()
        if not any(d.ep_name == name for d in ort.get_ep_devices()):
            ort.register_execution_provider_library(name, plugin.get_library_path())
        devices = [d for d in ort.get_ep_devices() if d.ep_name == name and d.device.type.name == "CPU"]
        if devices:
            options.add_provider_for_devices(devices, {})
            return "plugin"
    except Exception as e:  # not installed, or this onnxruntime cannot load plugins: try the runtime
        log.debug("OpenVINO EP plugin not usable: %s", e)
    try:
        import openvino  # noqa: F401
    except ImportError:
        raise BackendError(
            "the 'openvino' cpu_execution_accelerator needs OpenVINO, which is not installed: pip install "
            "'trireme[openvino]' (the 'openvino' package; or onnxruntime-openvino in place of onnxruntime)"
        ) from None
    return "runtime"


def _to_str(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)
