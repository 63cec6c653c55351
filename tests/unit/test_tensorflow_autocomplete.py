"""Triton's TensorFlow auto-complete rules on SavedModel signatures (pure: no TensorFlow needed)."""

from __future__ import annotations

from typing import Any

import pytest

from service.worker.backends.base import BackendError
from service.worker.backends.tensorflow_signature import complete_config

# signature key -> (config type, shape, graph tensor name), as signature_io returns them
BATCHED_IN = {"a": ("TYPE_FP32", [-1, 4], "serving_default_a:0"), "n": ("TYPE_INT64", [-1], "serving_default_n:0")}
BATCHED_OUT = {"out": ("TYPE_FP32", [-1, 3], "Call:0"), "text": ("TYPE_STRING", [-1, 1], "Call:1")}


def tensors(config: dict[str, Any], key: str) -> dict[str, tuple[str, list[int], Any]]:
    return {t["name"]: (t["data_type"], t["dims"], t.get("reshape")) for t in config[key]}


def test_batching_signature_gets_default_max_batch_size_dynamic_batcher_and_scalar_reshape() -> None:
    config = complete_config({"name": "m", "max_batch_size": 0, "input": [], "output": []}, BATCHED_IN, BATCHED_OUT)
    assert config["max_batch_size"] == 4 and config["dynamic_batching"] == {}
    assert tensors(config, "input") == {"a": ("TYPE_FP32", [4], None), "n": ("TYPE_INT64", [1], {"shape": []})}
    assert tensors(config, "output") == {"out": ("TYPE_FP32", [3], None), "text": ("TYPE_STRING", [1], None)}


def test_fixed_first_dimension_is_not_batching() -> None:
    config = complete_config({"name": "m"}, {"x": ("TYPE_FP32", [2, 4], "x:0")}, {"y": ("TYPE_FP32", [2], "y:0")})
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert tensors(config, "input") == {"x": ("TYPE_FP32", [2, 4], None)}


def test_named_outputs_only_are_completed_and_a_given_scheduler_is_kept() -> None:
    given = {"name": "m", "output": [{"name": "text"}], "sequence_batching": {}}
    config = complete_config(given, BATCHED_IN, BATCHED_OUT)
    assert list(tensors(config, "output")) == ["text"] and "dynamic_batching" not in config


def test_config_dims_without_batch_dim_say_the_model_does_not_batch() -> None:
    given = {"name": "m", "input": [{"name": "a", "dims": [-1, 4]}]}  # the full signature shape: no batching
    config = complete_config(given, BATCHED_IN, BATCHED_OUT)
    assert config["max_batch_size"] == 0
    assert tensors(config, "output")["out"] == ("TYPE_FP32", [-1, 3], None)


def test_contradicting_hints_and_impossible_max_batch_size_fail_with_tritons_messages() -> None:
    given = {"name": "m", "input": [{"name": "a", "dims": [-1, 4]}], "output": [{"name": "out", "dims": [3]}]}
    with pytest.raises(BackendError, match="model tensor configurations are contradicting each other"):
        complete_config(given, BATCHED_IN, BATCHED_OUT)
    with pytest.raises(BackendError, match="configuration specified max-batch 8 but model signature does not"):
        complete_config({"name": "m", "max_batch_size": 8}, {"x": ("TYPE_FP32", [2], "x:0")}, {})
    with pytest.raises(BackendError, match="the rank of model tensor 'x' is 0 which is not supported"):
        complete_config({"name": "m"}, {"x": ("TYPE_FP32", None, "x:0")}, {})
