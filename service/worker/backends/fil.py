"""Tree models as Triton's FIL backend takes them (`backend: "fil"`): XGBoost, LightGBM and Treelite checkpoints.

Each model type runs on its own framework's predict, which measured fastest here (docs/benchmarks.md: XGBoost's
inplace_predict and LightGBM's predict beat Treelite's GTIL interpreter 3-8x at batch 32+), and gives answers
equal to that framework's own `predict` / `predict_proba`. Treelite checkpoints (scikit-learn forests exported
with treelite.sklearn, any Treelite model) run on treelite.gtil.

Config semantics are FIL's: parameters `model_type` (default `xgboost`), `is_classifier` (or the older
`output_class`; one is required), `predict_proba`, `threshold` (binary classifiers, default 0.5), `cpu_nthread`;
`input__0` FP32 [n_features] -> `output__0` FP32. The output is, per row: a regressor's prediction; a classifier's
class (binary: 1.0 when the probability is above `threshold`; multiclass: the argmax); with `predict_proba` every
class's probability (binary models give [1 - p, p]). Size-1 output dimensions are dropped as FIL does, so
`dims: [1]` answers shape [batch].
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from service.worker.backends.base import (
    BackendContext,
    BackendError,
    BatchingBackend,
    config_parameter,
    default_thread_count,
)

# model_type -> the file FIL looks for in the version directory when default_model_filename is not set
MODEL_FILES: dict[str, str] = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
}
# which pip package serves each model type (named in the load error when it is missing)
PACKAGES: dict[str, str] = {
    "xgboost": "xgboost",
    "xgboost_json": "xgboost",
    "xgboost_ubj": "xgboost",
    "lightgbm": "lightgbm",
    "treelite_checkpoint": "treelite",
}
INPUT = "input__0"
OUTPUT = "output__0"

Predict = Callable[[np.ndarray], np.ndarray]


def _bool_param(config: dict[str, Any], key: str, default: bool | None) -> bool | None:
    """A `true`/`false` parameter (FIL reads them with C++ boolalpha: nothing else is accepted)."""
    entry = config.get("parameters", {}).get(key)
    if not isinstance(entry, dict):
        return default
    value = str(entry.get("string_value", "")).strip()
    if value in ("true", "false"):
        return value == "true"
    raise BackendError(f"Bad input for parameter {key}: '{value}' (expected true or false)")


def _number_param(config: dict[str, Any], key: str, default: str, kind: type) -> Any:
    value = config_parameter(config, key, default).strip() or default
    try:
        return kind(value)
    except ValueError:
        raise BackendError(f"Bad input for parameter {key}: '{value}' (expected a number)") from None


def _import(module: str, model_type: str) -> Any:
    try:
        return __import__(module)
    except ImportError as e:
        raise BackendError(
            f"model_type '{model_type}' needs the '{PACKAGES[model_type]}' package, which is not installed "
            f"({e}); install it with: pip install 'trireme[fil]'"
        ) from None


def _load_xgboost(path: str, model_type: str, threads: int) -> tuple[Predict, int]:
    xgb = _import("xgboost", model_type)
    try:
        booster = xgb.Booster(model_file=path)
    except Exception as e:
        if model_type == "xgboost":  # XGBoost's legacy binary format, which XGBoost 3 no longer reads
            try:
                return _load_treelite(path, "treelite_checkpoint", threads, legacy_xgboost=True)
            except BackendError:
                pass
        raise BackendError(f"XGBoost could not read '{path}' as model_type '{model_type}': {e}") from None
    booster.set_param({"nthread": threads})
    objective = json.loads(booster.save_config())["learner"]["objective"]["name"]
    if objective == "multi:softmax":  # XGBoost answers labels there; FIL (via Treelite) answers class probabilities

        def softmax(x: np.ndarray) -> np.ndarray:
            margin = np.asarray(booster.inplace_predict(x, predict_type="margin", validate_features=False))
            e = np.exp(margin - margin.max(axis=1, keepdims=True))
            return np.asarray(e / e.sum(axis=1, keepdims=True))

        return softmax, int(booster.num_features())

    def predict(x: np.ndarray) -> np.ndarray:
        return np.asarray(booster.inplace_predict(x, validate_features=False))

    return predict, int(booster.num_features())


def _load_lightgbm(path: str, model_type: str, threads: int) -> tuple[Predict, int]:
    lgb = _import("lightgbm", model_type)
    try:
        booster = lgb.Booster(model_file=path)
    except Exception as e:
        raise BackendError(f"LightGBM could not read '{path}' as model_type '{model_type}': {e}") from None

    def predict(x: np.ndarray) -> np.ndarray:
        return np.asarray(booster.predict(x, num_threads=threads))

    return predict, int(booster.num_feature())


def _load_treelite(path: str, model_type: str, threads: int, legacy_xgboost: bool = False) -> tuple[Predict, int]:
    treelite = _import("treelite", model_type)
    import treelite.gtil as gtil

    try:
        if legacy_xgboost:
            model = treelite.frontend.load_xgboost_model_legacy_binary(path)
        else:
            model = treelite.Model.deserialize(path)
    except Exception as e:
        raise BackendError(f"Treelite could not read '{path}' as model_type '{model_type}': {e}") from None

    try:  # Treelite refuses more threads than OpenMP allows here (OMP_NUM_THREADS); <= 0 means "all it may use"
        gtil.predict(model, np.zeros((1, model.num_feature), np.float32), nthread=threads)
    except Exception:
        threads = -1

    def predict(x: np.ndarray) -> np.ndarray:
        out = np.asarray(gtil.predict(model, x, nthread=threads))  # (rows, targets, classes)
        return out.reshape(out.shape[0], -1)

    return predict, int(model.num_feature)


LOADERS: dict[str, Callable[[str, str, int], tuple[Predict, int]]] = {
    "xgboost": _load_xgboost,
    "xgboost_json": _load_xgboost,
    "xgboost_ubj": _load_xgboost,
    "lightgbm": _load_lightgbm,
    "treelite_checkpoint": _load_treelite,
}


class FilBackend(BatchingBackend):
    """Backend for `backend: "fil"` models."""

    def __init__(self, context: BackendContext) -> None:
        super().__init__(context)
        self.predict: Predict | None = None
        self.n_features = 0
        self.width = 0  # columns the framework's prediction has (1: regression / binary, k: k classes)
        self.is_classifier = False
        self.predict_proba = False
        self.threshold = 0.5
        self.output_dims: list[int] = []

    def _fail(self, message: str) -> BackendError:
        return BackendError(f"unable to load model '{self.context.model_name}': {message}")

    def initialize(self) -> None:
        """Read the FIL parameters, load the model with its framework and check the config's tensors against it."""
        ctx = self.context
        config = ctx.config
        model_type = config_parameter(config, "model_type", "xgboost")
        if model_type not in MODEL_FILES:
            raise self._fail(
                f"model_type '{model_type}' not recognized as a valid serialization format (valid: "
                f"{', '.join(MODEL_FILES)})"
            )
        try:
            # FIL's older name wins when both are given, as in FIL
            is_classifier = _bool_param(config, "output_class", None)
            if is_classifier is None:
                is_classifier = _bool_param(config, "is_classifier", None)
            if is_classifier is None:
                raise BackendError("Required parameter is_classifier (or output_class) not found in config")
            self.is_classifier = is_classifier
            self.predict_proba = bool(_bool_param(config, "predict_proba", False))
            self.threshold = float(_number_param(config, "threshold", "0.5", float))
            threads = int(_number_param(config, "cpu_nthread", "-1", int))
        except BackendError as e:
            raise self._fail(str(e)) from None
        if threads <= 0:
            # FIL's -1 ("all"): what OpenMP may use in this worker. Trireme starts workers with OMP_NUM_THREADS=1
            # unless the server's environment sets it: on a busy machine a second OpenMP thread that spins at
            # barriers made LightGBM up to 70x slower per small batch here (docs/benchmarks.md)
            omp = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
            threads = int(omp) if omp.isdigit() and int(omp) > 0 else default_thread_count(config)
        filename = config.get("default_model_filename", "") or MODEL_FILES[model_type]
        path = os.path.join(ctx.version_dir, filename)
        if os.path.isdir(path):
            path = os.path.join(path, MODEL_FILES[model_type])
        if not os.path.isfile(path):
            raise self._fail(f"model_type '{model_type}' expects the model file '{path}', which does not exist")
        try:
            self.predict, self.n_features = LOADERS[model_type](path, model_type, threads)
        except BackendError as e:
            raise self._fail(str(e)) from None
        probe = self._raw(np.zeros((1, self.n_features), dtype=np.float32))
        self.width = int(probe.shape[1])
        self._check_config(model_type)

    def _check_config(self, model_type: str) -> None:
        """input__0 FP32 [n_features] and output__0 FP32 with as many values per row as the answer has."""
        inputs, outputs = self.config_inputs, self.config_outputs
        if [t["name"] for t in inputs] != [INPUT]:
            names = ", ".join(f"'{t['name']}'" for t in inputs) or "none"
            raise self._fail(f"the fil backend takes exactly one input named '{INPUT}' (configuration has {names})")
        if [t["name"] for t in outputs] != [OUTPUT]:
            names = ", ".join(f"'{t['name']}'" for t in outputs) or "none"
            raise self._fail(f"the fil backend gives exactly one output named '{OUTPUT}' (configuration has {names})")
        for kind, tensor in (("input", inputs[0]), ("output", outputs[0])):
            if tensor.get("data_type") != "TYPE_FP32":
                raise self._fail(
                    f"{kind} '{tensor['name']}' must be TYPE_FP32 for the fil backend, configuration has "
                    f"{tensor.get('data_type')}"
                )
        in_dims = [int(d) for d in inputs[0].get("dims", [])]
        if self.max_batch_size == 0:
            in_dims = in_dims[1:]  # without batching the first dimension is the row count
        if in_dims not in ([self.n_features], [-1]):
            raise self._fail(
                f"input '{INPUT}' has dims {in_dims} but the {model_type} model takes {self.n_features} features "
                f"(dims: [ {self.n_features} ])"
            )
        out_dims = [int(d) for d in outputs[0].get("dims", [])]
        if self.max_batch_size == 0:
            out_dims = out_dims[1:]
        expected = self._answer_width()
        if -1 not in out_dims and math.prod(out_dims) != expected:
            what = (
                "one probability per class" + (" (binary models give 2)" if self.width == 1 else "")
                if self.predict_proba
                else "one class per row"
                if self.is_classifier
                else f"{expected} value(s) per row"
            )
            raise self._fail(
                f"output '{OUTPUT}' has dims {out_dims} but the model answers {what}: dims: [ {expected} ]"
            )
        # FIL drops size-1 dimensions from the answer (dims [1] -> shape [batch])
        self.output_dims = [d for d in out_dims if d != 1] if -1 not in out_dims else [expected][: expected > 1]

    def _answer_width(self) -> int:
        if self.predict_proba:
            return 2 if self.width == 1 else self.width
        return 1 if self.is_classifier else self.width

    def _raw(self, x: np.ndarray) -> np.ndarray:
        """The framework's prediction as float32 (rows, width)."""
        assert self.predict is not None
        out = self.predict(x)
        return out.reshape(out.shape[0], -1).astype(np.float32, copy=False)

    def run(self, inputs: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
        """Predict the gathered rows and shape the answer as FIL does."""
        x = np.asarray(inputs[INPUT], dtype=np.float32).reshape(-1, self.n_features)
        raw = self._raw(x)
        if self.predict_proba:
            answer = np.concatenate([1.0 - raw, raw], axis=1) if self.width == 1 else raw
        elif self.is_classifier:
            if self.width == 1:
                answer = (raw[:, 0] > self.threshold).astype(np.float32)
            else:
                answer = np.argmax(raw, axis=1).astype(np.float32)
        else:
            answer = raw
        return {OUTPUT: answer.reshape(x.shape[0], *self.output_dims)}
