"""The TensorFlow backend: platforms tensorflow_graphdef (a frozen GraphDef) and tensorflow_savedmodel.

Like Triton's TensorFlow backend, each instance runs one TF session (tf.compat.v1) configured from the model
config: thread counts, the global JIT (XLA) level from `optimization { graph { level } }`, and on GPU instances
the GPU accelerators. Config tensors map to model tensors by name: GraphDef node names (a `:<index>` suffix
picks another output of the node; `name` means `name:0`), SavedModel signature keys.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from service.worker.backends.base import (
    BackendContext,
    BackendError,
    BatchingBackend,
    check_tensor,
    config_parameter,
    default_thread_count,
)
from service.worker.backends.tensorflow_signature import (
    DEFAULT_TAG,
    TF_TYPES,
    complete_config,
    pick_signature,
    read_meta_graph,
    signature_io,
    tensor_info,
)

log = logging.getLogger("trireme.worker.tensorflow")

GRAPHDEF = "tensorflow_graphdef"
SAVEDMODEL = "tensorflow_savedmodel"
DEFAULT_FILES = {GRAPHDEF: "model.graphdef", SAVEDMODEL: "model.savedmodel"}
_TRUE = ("true", "1", "yes", "on")
_INDEX = re.compile(r"^(.*):(\d+)$")


def _tf(model: str) -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # fewer INFO lines; TF_CPP_MIN_LOG_LEVEL=0 shows them all
    try:
        import tensorflow as tf
    except ImportError as e:
        raise BackendError(
            f"unable to load model '{model}': the tensorflow backend needs the 'tensorflow' package (pip install "
            f"'trireme[tensorflow]'), which is not installed in the worker's environment ({e})"
        ) from None
    return tf


def _split_index(name: str) -> tuple[str, int]:
    """'node:1' -> ('node', 1); 'node' -> ('node', 0)."""
    m = _INDEX.match(name)
    return (m.group(1), int(m.group(2))) if m else (name, 0)


def _allowed(names: list[str], limit: int = 25) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


# ---- the backend -----------------------------------------------------------------------------------------
class TensorFlowBackend(BatchingBackend):
    """Backend for `platform: "tensorflow_graphdef"` / `"tensorflow_savedmodel"` (`backend: "tensorflow"`)."""

    def __init__(self, context: BackendContext) -> None:
        super().__init__(context)
        self.tf: Any = None
        self.session: Any = None
        self.graph: Any = None
        self.feeds: dict[str, str] = {}  # request input name -> graph tensor name
        self.fetches: list[tuple[str, str]] = []  # (config output name, graph tensor name)
        self.callables: dict[tuple[str, ...], Callable[..., Any]] = {}

    @classmethod
    def auto_complete(cls, config: dict[str, Any], model_dir: str, version_dir: str) -> dict[str, Any]:
        """SavedModels complete their config from the signature; a GraphDef carries too little to do so."""
        if config.get("platform") != SAVEDMODEL:
            return config
        name = config.get("name") or os.path.basename(model_dir)
        path = os.path.join(version_dir, config.get("default_model_filename") or DEFAULT_FILES[SAVEDMODEL])
        if not os.path.isdir(path):
            return config  # the load reports the missing model file
        tf = _tf(name)
        meta = read_meta_graph(tf, path, config_parameter(config, "TF_GRAPH_TAG") or DEFAULT_TAG, name)
        _, signature = pick_signature(meta, config_parameter(config, "TF_SIGNATURE_DEF"), name)
        inputs, outputs = signature_io(tf, signature)
        return complete_config({**config, "name": name}, inputs, outputs)

    # ---- load --------------------------------------------------------------------------------------------
    def initialize(self) -> None:
        """Check the config, open the session on the instance's device, map and check every config tensor."""
        ctx = self.context
        config = ctx.config
        platform = config.get("platform", "")
        if platform not in DEFAULT_FILES:
            raise BackendError(f"platform {platform} not supported for TensorFlow model '{ctx.model_name}'")
        for t in [*self.config_inputs, *self.config_outputs]:
            if t.get("data_type") not in TF_TYPES.values():
                raise BackendError(
                    f"unsupported datatype '{t.get('data_type')}' for tensor '{t['name']}' for model '{ctx.model_name}'"
                )
        filename = config.get("default_model_filename") or DEFAULT_FILES[platform]
        path = os.path.join(ctx.version_dir, filename)
        if not os.path.exists(path):
            raise BackendError(
                f"unable to load model '{ctx.model_name}': unable to find '{path}' for model instance "
                f"'{ctx.instance_name}'"
            )
        self.tf = _tf(ctx.model_name)
        session_config = self._session_config()
        if platform == GRAPHDEF:
            self._load_graphdef(path, session_config)
        else:
            self._load_savedmodel(path, session_config)
        self._run_init_ops()

    def _int_parameter(self, key: str) -> int:
        raw = config_parameter(self.context.config, key, "0").strip() or "0"
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if value < 0:
            raise BackendError(
                f"parameter '{key}' must be non-negative number for TensorFlow model '{self.context.model_name}'"
            )
        return value

    def _session_config(self) -> Any:
        """ConfigProto: threads (TF_NUM_INTRA_THREADS / TF_NUM_INTER_THREADS), global JIT level, accelerators."""
        ctx, config = self.context, self.context.config
        intra = self._int_parameter("TF_NUM_INTRA_THREADS") or default_thread_count(config)
        inter = self._int_parameter("TF_NUM_INTER_THREADS") or default_thread_count(config)
        share = config_parameter(config, "MAX_SESSION_SHARE_COUNT", "1").strip() or "1"
        if not share.isdigit() or int(share) <= 0:  # accepted for compatibility: each instance has its own process
            raise BackendError(
                f"parameter 'MAX_SESSION_SHARE_COUNT' must be positive number for TensorFlow model '{ctx.model_name}'"
            )
        proto = self.tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=intra,
            inter_op_parallelism_threads=inter,
            use_per_session_threads=config_parameter(config, "TF_USE_PER_SESSION_THREADS").lower() in _TRUE,
            allow_soft_placement=True,
        )
        optimization = config.get("optimization", {})
        if "graph" in optimization:  # Triton: -1 off, 0 TF's default, 1 ON_1, >1 ON_2
            level = int(optimization["graph"].get("level", 0) or 0)
            jit = proto.graph_options.optimizer_options
            jit.global_jit_level = jit.OFF if level < 0 else jit.DEFAULT if level == 0 else min(level, 2)
        accelerators = optimization.get("execution_accelerators", {})
        if accelerators.get("cpu_execution_accelerator"):
            raise BackendError(
                f"unable to load model '{ctx.model_name}': CPU Execution Accelerator is not supported in TensorFlow "
                "backend"
            )
        gpu_accelerators = accelerators.get("gpu_execution_accelerator", [])
        if ctx.instance_kind != "GPU":
            if gpu_accelerators:  # the config says they are for GPU instances
                log.warning("GPU Execution Accelerator will be ignored for model instance on CPU")
            return proto
        if not self.tf.config.list_physical_devices("GPU"):
            raise BackendError(
                f"model '{ctx.model_name}': instance '{ctx.instance_name}' is KIND_GPU but this TensorFlow build has "
                "no GPU support (tensorflow-cpu) or no GPU is visible"
            )
        names = [a.get("name") for a in gpu_accelerators]
        for name in names:
            if name not in ("tensorrt", "auto_mixed_precision", "gpu_io"):
                raise BackendError(
                    f"unable to load model '{ctx.model_name}': unknown Execution Accelerator '{name}' is requested"
                )
        if "tensorrt" in names and "auto_mixed_precision" in names:
            raise BackendError(
                f"unable to load model '{ctx.model_name}': Auto mixed precision can not be set with TFTRT optimization"
            )
        if "tensorrt" in names:
            raise BackendError(
                f"model '{ctx.model_name}': TF-TRT (gpu_execution_accelerator 'tensorrt') is not "
                "supported by Trireme's TensorFlow backend yet"
            )
        if "auto_mixed_precision" in names:
            proto.graph_options.rewrite_options.auto_mixed_precision = 1  # RewriterConfig.ON
        proto.gpu_options.allow_growth = True
        return proto

    def _device(self) -> str:
        ctx = self.context
        return f"/gpu:{ctx.device_id}" if ctx.instance_kind == "GPU" else "/cpu:0"

    def _load_graphdef(self, path: str, session_config: Any) -> None:
        tf, model = self.tf, self.context.model_name
        graph_def = tf.compat.v1.GraphDef()
        try:
            with open(path, "rb") as f:
                graph_def.ParseFromString(f.read())
        except Exception as e:
            raise BackendError(f"unable to load model '{model}': '{path}' is not a GraphDef: {e}") from None
        if not graph_def.node:
            raise BackendError(f"unable to load model '{model}': model {model} has an empty network")
        if self.context.instance_kind != "MODEL":
            for node in graph_def.node:
                node.device = ""
        self.graph = tf.Graph()
        try:
            with self.graph.as_default(), tf.device(self._device()):
                tf.graph_util.import_graph_def(graph_def, name="")
        except Exception as e:
            raise BackendError(f"unable to load model '{model}': the GraphDef '{path}' does not import: {e}") from None
        self.session = tf.compat.v1.Session(graph=self.graph, config=session_config)
        ops = {op.name: op for op in self.graph.get_operations()}
        placeholders = sorted(n for n, op in ops.items() if op.type == "Placeholder")
        if len(placeholders) < len(self.config_inputs):
            raise BackendError(
                f"unable to load model '{model}', configuration expects {len(self.config_inputs)} inputs, model "
                f"provides at most {len(placeholders)}"
            )

        def resolve(kind: str, name: str, allowed: list[str]) -> str:
            op_name, index = _split_index(name)
            op = ops.get(op_name) if op_name in allowed or kind == "output" else None
            if op is None or index >= len(op.outputs):
                raise BackendError(
                    f"unable to load model '{model}', unexpected inference {kind} '{name}', allowed {kind}s are: "
                    f"{_allowed(allowed)}"
                )
            return f"{op_name}:{index}"

        for name in self.model_input_names():
            self.feeds[name] = resolve("input", name, placeholders)
        outputs = sorted(n for n, op in ops.items() if op.outputs and op.type != "Placeholder")
        self.fetches = [(t["name"], resolve("output", t["name"], outputs)) for t in self.config_outputs]
        # data types always; shapes of inputs only: Triton never checks a GraphDef's output shapes (it answers
        # with the shape TF produces), so a config that works there must load here
        for kind, specs, pairs in (
            ("input", self.config_inputs, self.feeds.items()),
            ("output", self.config_outputs, self.fetches),
        ):
            by_name = {t["name"]: t for t in specs}
            for name, tensor_name in pairs:
                if name not in by_name:  # a batch input: made by the worker in the model's own shape
                    continue
                tensor = self.graph.get_tensor_by_name(tensor_name)
                dtype, shape = tensor_info(self.tf, tensor.dtype, tensor.shape)
                self._check(kind, by_name[name], dtype, shape if kind == "input" else None)

    def _check(self, kind: str, spec: dict[str, Any], dtype: str, shape: list[int] | None) -> None:
        """check_tensor against the config's dims (its reshape when given); shape None checks the type only."""
        if kind == "input" and spec["name"] in self.ragged:  # the model takes it as one 1-D tensor
            check_tensor(
                self.context.model_name,
                kind,
                spec["name"],
                spec.get("data_type", ""),
                [-1],
                dtype,
                shape if shape is not None else [-1],
                0,
            )
            return
        dims = [int(d) for d in (spec["reshape"].get("shape", []) if "reshape" in spec else spec.get("dims", []))]
        if shape is None:
            shape = ([-1] if self.max_batch_size > 0 else []) + dims
        check_tensor(
            self.context.model_name,
            kind,
            spec["name"],
            spec.get("data_type", ""),
            dims,
            dtype,
            shape,
            self.max_batch_size,
        )

    def _load_savedmodel(self, path: str, session_config: Any) -> None:
        tf, ctx = self.tf, self.context
        model, config = ctx.model_name, ctx.config
        tag = config_parameter(config, "TF_GRAPH_TAG") or DEFAULT_TAG
        meta = read_meta_graph(tf, path, tag, model)
        sig_name, signature = pick_signature(meta, config_parameter(config, "TF_SIGNATURE_DEF"), model)
        inputs, outputs = signature_io(tf, signature)
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph, config=session_config)
        try:
            with self.graph.as_default(), tf.device(self._device()):
                tf.compat.v1.saved_model.loader.load(
                    self.session, [tag], path, clear_devices=ctx.instance_kind != "MODEL"
                )
        except Exception as e:
            raise BackendError(f"unable to load model '{model}' from '{path}': {e}") from None
        controls = [c["name"] for c in config.get("sequence_batching", {}).get("control_input", []) if c.get("name")]
        expected = len(self.config_inputs) + len(controls) + len(config.get("batch_input", []))
        if len(inputs) != expected:
            raise BackendError(
                f"unable to load model '{model}', configuration expects {len(self.config_inputs)} inputs, model "
                f"provides {len(inputs)}"
            )
        for name in self.batch_input_names:
            if name not in inputs:
                raise BackendError(f"unable to load model '{model}': batch input '{name}' is not an input of the model")
            self.feeds[name] = inputs[name][2]
        for name in controls:
            if name not in inputs:
                raise BackendError(
                    f"configuration specified sequence control '{name}', but model does not provide that input"
                )
            self.feeds[name] = inputs[name][2]
        for kind, specs, found in (("input", self.config_inputs, inputs), ("output", self.config_outputs, outputs)):
            for spec in specs:
                key = spec["name"] if spec["name"] in found else _split_index(spec["name"])[0]
                if key not in found:
                    raise BackendError(
                        f"unable to load model '{model}', unexpected inference {kind} '{spec['name']}', allowed "
                        f"{kind}s are: {_allowed(list(found))}"
                    )
                dtype, shape, tensor_name = found[key]
                self._check(kind, spec, dtype, shape)
                if kind == "input":
                    self.feeds[spec["name"]] = tensor_name
                else:
                    self.fetches.append((spec["name"], tensor_name))
        log.debug("model '%s': signature '%s' of tag '%s'", model, sig_name, tag)

    def _run_init_ops(self) -> None:
        """TF_INIT_OPS_FILE: a JSON file {"init_ops": [...]} in the version folder (preferred) or the model folder."""
        filename = config_parameter(self.context.config, "TF_INIT_OPS_FILE")
        if not filename:
            return
        ctx = self.context
        for folder in (ctx.version_dir, ctx.model_dir):
            path = os.path.join(folder, filename)
            if os.path.isfile(path):
                break
        else:
            raise BackendError(f"unable to load model '{ctx.model_name}': TF_INIT_OPS_FILE '{filename}' not found")
        try:
            with open(path, encoding="utf-8") as f:
                ops = json.load(f)["init_ops"]
            self.session.run([self.graph.get_operation_by_name(op) for op in ops])
        except Exception as e:
            raise BackendError(f"unable to load model '{ctx.model_name}': init ops from '{path}' failed: {e}") from None

    # ---- execute -----------------------------------------------------------------------------------------
    def run(self, inputs: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
        """One session call over the gathered inputs (a callable per input set, made on first use)."""
        names = tuple(inputs)
        call = self.callables.get(names)
        if call is None:
            unknown = [n for n in names if n not in self.feeds]
            if unknown:
                raise BackendError(f"unexpected inference input '{unknown[0]}' for model '{self.context.model_name}'")
            call = self.session.make_callable([g for _, g in self.fetches], [self.feeds[n] for n in names])
            self.callables[names] = call
        results = call(*(inputs[n] for n in names))
        return {name: np.asarray(value) for (name, _), value in zip(self.fetches, results, strict=True)}

    def finalize(self) -> None:
        """Close the session."""
        if self.session is not None:
            self.session.close()
            self.session = None
