"""The Python API's parts without a server: tensors in and out of DLPack, options as flags, the config a bound
function's declaration makes, and @batch's stacking and splitting."""

from __future__ import annotations

import numpy as np
import pytest

from service.config.flags import parse_args
from service.core.repository.model_config import parse_config_text
from trireme.bind.decorators import batch
from trireme.bind.request import Request
from trireme.bind.spec import DynamicBatcher, ModelConfig, Tensor, config_text, named
from trireme.tritonserver import DataType, InvalidArgumentError, ModelControlMode, Options
from trireme.tritonserver import Tensor as ServerTensor


def test_tensors_round_trip_through_dlpack_and_bytes() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = ServerTensor._from_object(array)
    assert tensor.data_type == DataType.FP32 and list(tensor.shape) == [2, 3]
    assert np.from_dlpack(tensor).tolist() == array.tolist()
    assert ServerTensor.from_dlpack(array).data_type == DataType.FP32
    assert ServerTensor._from_object([1, 2, 3]).data_type == DataType.INT64
    strings = ServerTensor.from_string_array([["ab", "c"]])
    assert strings.data_type == DataType.BYTES and strings.to_string_array().tolist() == [["ab", "c"]]
    assert bytes(strings._raw()) == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c"
    with pytest.raises(InvalidArgumentError, match="not BYTES"):
        tensor.to_bytes_array()
    with pytest.raises(InvalidArgumentError, match="not supported"):
        ServerTensor._from_object(object())


def test_options_become_server_flags() -> None:
    options = Options(
        model_repository="/m",
        model_control_mode=ModelControlMode.EXPLICIT,
        startup_models=["a"],
        exit_timeout=5,
        cache_config={"local": {"size": 1024}},
    )
    config = parse_args(options.to_flags(["/bound"]))
    assert config.model_repositories == ["/m", "/bound"]
    assert config.model_control_mode == "explicit" and config.load_models == ["a"]
    assert config.exit_timeout_secs == 5 and config.cache_bytes == 1024
    with pytest.raises(InvalidArgumentError, match="Model repository must be specified"):
        Options().to_flags()


def test_a_declaration_makes_the_config_pytriton_would() -> None:
    inputs = named([Tensor(dtype=np.float32, shape=(-1,)), Tensor(name="s", dtype=np.bytes_, shape=(1,))], "INPUT")
    outputs = named([Tensor(dtype=np.int32, shape=(2, 2))], "OUTPUT")
    batcher = DynamicBatcher(max_queue_delay_microseconds=100, preferred_batch_size=[2, 4])
    text = config_text("m", inputs, outputs, ModelConfig(max_batch_size=8, batcher=batcher, decoupled=True), 3, {})
    config = parse_config_text(text, "m/config.pbtxt")
    assert [i.name for i in config.input] == ["INPUT_1", "s"] and config.output[0].name == "OUTPUT_1"
    assert list(config.output[0].dims) == [2, 2] and config.max_batch_size == 8
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]
    assert config.instance_group[0].count == 3 and config.model_transaction_policy.decoupled
    unbatched = parse_config_text(config_text("m", inputs, outputs, ModelConfig(batching=False), 1, {}), "m")
    assert unbatched.max_batch_size == 0 and not unbatched.HasField("dynamic_batching")
    with pytest.raises(ValueError, match="declared more than once"):
        named([Tensor(name="a", dtype=np.float32, shape=(1,))] * 2, "INPUT")


def test_batch_stacks_requests_and_splits_the_answer() -> None:
    seen = []

    @batch
    def fn(a: np.ndarray) -> dict[str, np.ndarray]:
        seen.append(a.shape)
        return {"y": a + 1}

    requests = [Request({"a": np.zeros((1, 2))}), Request({"a": np.ones((2, 2))})]
    out = fn(requests)
    assert seen == [(3, 2)]
    assert [o["y"].shape for o in out] == [(1, 2), (2, 2)] and out[1]["y"].tolist() == [[2.0, 2.0]] * 2

    @batch
    def short(a: np.ndarray) -> list[np.ndarray]:
        return [a[:1]]

    with pytest.raises(ValueError, match="Expected batch size: 3"):
        short(requests)
