"""Wire/text compatibility of ``protos/*.proto`` with Triton's protos as shipped in tritonclient.

tritonclient's ``service_pb2`` / ``model_config_pb2`` declare the same ``inference.*`` symbols as ours,
so both cannot live in the default descriptor pool. We therefore pull the serialized file descriptors
out of tritonclient's generated sources (without importing them) into a private pool and compare.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import descriptor_pool, message_factory, text_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor, FileDescriptor

from protos import grpc_service_pb2, health_pb2, model_config_pb2


def _serialized_descriptor(path: Path) -> bytes:
    """Return the bytes passed to ``AddSerializedFile`` in a generated ``*_pb2.py``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, bytes)
        ):
            return node.args[0].value
    raise AssertionError(f"no serialized descriptor in {path}")


def _triton_files() -> tuple[FileDescriptor, FileDescriptor]:
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("tritonclient is not installed")
    grpc_dir = Path(next(iter(spec.submodule_search_locations))) / "grpc"
    pool = descriptor_pool.DescriptorPool()
    model_config = pool.AddSerializedFile(_serialized_descriptor(grpc_dir / "model_config_pb2.py"))
    service = pool.AddSerializedFile(_serialized_descriptor(grpc_dir / "service_pb2.py"))
    return pool.FindFileByName(model_config.name), pool.FindFileByName(service.name)


TRITON_MODEL_CONFIG, TRITON_SERVICE = _triton_files()
OURS = {f.name: f for f in (model_config_pb2.DESCRIPTOR, grpc_service_pb2.DESCRIPTOR)}
OURS_POOL = model_config_pb2.DESCRIPTOR.pool


def _walk(messages: list[Descriptor]) -> Iterator[Descriptor]:
    for m in messages:
        yield m
        yield from _walk(list(m.nested_types))


def _all_messages(f: FileDescriptor) -> list[Descriptor]:
    return list(_walk(list(f.message_types_by_name.values())))


def _all_enums(f: FileDescriptor) -> list[EnumDescriptor]:
    enums = list(f.enum_types_by_name.values())
    for m in _all_messages(f):
        enums.extend(m.enum_types)
    return enums


def _label(f: FieldDescriptor) -> str:
    return "repeated" if f.is_repeated else "required" if f.is_required else "optional"


def _field_sig(f: FieldDescriptor) -> tuple[object, ...]:
    sub = f.message_type or f.enum_type
    return (
        f.name,
        f.number,
        f.type,
        _label(f),
        sub.full_name if sub else None,
        f.containing_oneof.name if f.containing_oneof else None,
        f.has_presence,
    )


TRITON_MESSAGES = _all_messages(TRITON_MODEL_CONFIG) + _all_messages(TRITON_SERVICE)
TRITON_ENUMS = _all_enums(TRITON_MODEL_CONFIG) + _all_enums(TRITON_SERVICE)


def test_packages_and_files() -> None:
    assert model_config_pb2.DESCRIPTOR.package == TRITON_MODEL_CONFIG.package == "inference"
    assert grpc_service_pb2.DESCRIPTOR.package == TRITON_SERVICE.package == "inference"
    assert [d.name for d in grpc_service_pb2.DESCRIPTOR.dependencies] == ["protos/model_config.proto"]
    assert len(TRITON_MESSAGES) > 100  # sanity: the walk really found Triton's messages


@pytest.mark.parametrize("triton_msg", TRITON_MESSAGES, ids=lambda m: m.full_name)
def test_message_fields_match(triton_msg: Descriptor) -> None:
    ours = OURS_POOL.FindMessageTypeByName(triton_msg.full_name)
    assert ours.GetOptions().map_entry == triton_msg.GetOptions().map_entry
    assert [o.name for o in ours.oneofs] == [o.name for o in triton_msg.oneofs]
    ours_fields = {f.name: f for f in ours.fields}
    for tf in triton_msg.fields:
        assert tf.name in ours_fields, f"{triton_msg.full_name} lacks field {tf.name}"
        assert _field_sig(ours_fields[tf.name]) == _field_sig(tf)
    assert {m.name for m in triton_msg.nested_types} <= {m.name for m in ours.nested_types}


@pytest.mark.parametrize("triton_enum", TRITON_ENUMS, ids=lambda e: e.full_name)
def test_enum_values_match(triton_enum: EnumDescriptor) -> None:
    ours = OURS_POOL.FindEnumTypeByName(triton_enum.full_name)
    assert [(v.name, v.number) for v in ours.values] == [(v.name, v.number) for v in triton_enum.values]


def test_service_methods_match() -> None:
    theirs = TRITON_SERVICE.services_by_name["GRPCInferenceService"]
    ours = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"

    def sig(s: object) -> list[tuple[object, ...]]:
        return [
            (m.name, m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming)
            for m in s.methods  # type: ignore[attr-defined]
        ]

    assert sig(ours) == sig(theirs)
    assert ours.methods_by_name["ModelStreamInfer"].client_streaming
    assert ours.methods_by_name["ModelStreamInfer"].server_streaming


def test_health_proto() -> None:
    d = health_pb2.DESCRIPTOR
    assert d.package == "grpc.health.v1"
    check = d.services_by_name["Health"].methods_by_name["Check"]
    assert check.full_name == "grpc.health.v1.Health.Check"
    assert [(f.name, f.number) for f in health_pb2.HealthCheckRequest.DESCRIPTOR.fields] == [("service", 1)]
    assert health_pb2.HealthCheckResponse.DESCRIPTOR.fields_by_name["status"].number == 1
    status = health_pb2.HealthCheckResponse.ServingStatus
    assert list(status.items()) == [
        ("UNKNOWN", 0),
        ("SERVING", 1),
        ("NOT_SERVING", 2),
        ("SERVICE_UNKNOWN", 3),
    ]


def test_nested_names_used_by_tritonclient() -> None:
    req = grpc_service_pb2.ModelInferRequest()
    req.inputs.append(grpc_service_pb2.ModelInferRequest().InferInputTensor(name="IN", datatype="FP32"))
    req.outputs.add(name="OUT").parameters["binary_data"].bool_param = True
    req.parameters["sequence_id"].int64_param = 7
    assert grpc_service_pb2.ModelMetadataResponse.TensorMetadata(shape=[-1, 4]).shape == [-1, 4]
    assert grpc_service_pb2.RepositoryIndexResponse.ModelIndex(state="READY").state == "READY"
    assert grpc_service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(offset=1).offset == 1
    assert grpc_service_pb2.CudaSharedMemoryStatusResponse.RegionStatus(device_id=1).device_id == 1
    assert grpc_service_pb2.TraceSettingRequest.SettingValue(value=["OFF"]).value == ["OFF"]
    assert grpc_service_pb2.LogSettingsRequest.SettingValue(uint32_param=1).uint32_param == 1


def test_wire_roundtrip_with_triton_classes() -> None:
    theirs = message_factory.GetMessageClass(TRITON_SERVICE.pool.FindMessageTypeByName("inference.ModelInferRequest"))
    req = grpc_service_pb2.ModelInferRequest(model_name="m", id="1", raw_input_contents=[b"\x00\x01"])
    inp = req.inputs.add(name="IN", datatype="BYTES", shape=[1, 2])
    inp.parameters["shared_memory_region"].string_param = "r"
    inp.contents.bytes_contents.append(b"x")
    req.parameters["priority"].uint64_param = 3
    decoded = theirs.FromString(req.SerializeToString())
    assert text_format.MessageToString(decoded) == text_format.MessageToString(req)
    assert grpc_service_pb2.ModelInferRequest.FromString(decoded.SerializeToString()) == req

    cfg_cls = message_factory.GetMessageClass(
        TRITON_SERVICE.pool.FindMessageTypeByName("inference.ModelConfigResponse")
    )
    ours_cfg = grpc_service_pb2.ModelConfigResponse(config=text_format.Parse(CONFIG, model_config_pb2.ModelConfig()))
    assert text_format.MessageToString(cfg_cls.FromString(ours_cfg.SerializeToString())) == (
        text_format.MessageToString(ours_cfg)
    )


CONFIG = """
name: "simple"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
max_batch_size: 8
version_policy { latest { num_versions: 2 } }
input [
  { name: "INPUT0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, -1, -1 ] reshape { shape: [ 1, 3 ] } },
  { name: "INPUT1" data_type: TYPE_STRING dims: [ 1 ] optional: true allow_ragged_batch: true }
]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] label_filename: "labels.txt" } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5 max_queue_size: 10 }
  priority_queue_policy { key: 1 value { allow_timeout_override: true } }
}
instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_GPU gpus: [ 0, 1 ] } ]
parameters { key: "EXECUTION_ENV_PATH" value { string_value: "/env.tar.gz" } }
parameters: { key: "x" value: { string_value: "y" } }
model_transaction_policy { decoupled: true }
optimization {
  execution_accelerators {
    gpu_execution_accelerator : [ {
      name : "tensorrt"
      parameters { key: "precision_mode" value: "FP16" }
    } ]
    cpu_execution_accelerator : [ { name : "openvino" } ]
  }
  cuda { graphs: true graph_spec [ { batch_size: 4 input { key: "INPUT0" value { dim: [ 3, 8, 8 ] } } } ] }
  input_pinned_memory { enable: false }
}
model_warmup [ {
  name: "w" batch_size: 1
  inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } }
} ]
response_cache { enable: true }
"""

SEQUENCE_CONFIG = """
name: "seq"
backend: "python"
max_batch_size: 0
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  direct { max_queue_delay_microseconds: 10 minimum_slot_utilization: 0.5 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "IN_S" output_name: "OUT_S" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state [ { name: "init" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } ] } ]
}
"""

ENSEMBLE_CONFIG = """
name: "ens"
platform: "ensemble"
max_batch_size: 4
ensemble_scheduling {
  step [
    { model_name: "pre" model_version: -1
      input_map { key: "RAW" value: "IN" } output_map { key: "OUT" value: "mid" } },
    { model_name: "net" model_version: 1
      input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" } }
  ]
}
"""


def test_text_format_config_parses() -> None:
    cfg = text_format.Parse(CONFIG, model_config_pb2.ModelConfig())
    assert cfg.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 100
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert cfg.dynamic_batching.default_queue_policy.timeout_action == model_config_pb2.ModelQueuePolicy.DELAY
    assert cfg.dynamic_batching.priority_queue_policy[1].allow_timeout_override
    assert cfg.input[0].data_type == model_config_pb2.TYPE_FP32
    assert list(cfg.input[0].dims) == [3, -1, -1]
    assert list(cfg.input[0].reshape.shape) == [1, 3]
    assert cfg.input[1].data_type == model_config_pb2.TYPE_STRING
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert list(cfg.instance_group[1].gpus) == [0, 1]
    assert cfg.parameters["x"].string_value == "y"
    assert cfg.model_transaction_policy.decoupled
    accel = cfg.optimization.execution_accelerators
    assert accel.gpu_execution_accelerator[0].parameters["precision_mode"] == "FP16"
    assert accel.cpu_execution_accelerator[0].name == "openvino"
    assert list(cfg.optimization.cuda.graph_spec[0].input["INPUT0"].dim) == [3, 8, 8]
    assert cfg.model_warmup[0].inputs["INPUT0"].zero_data
    assert cfg.version_policy.WhichOneof("policy_choice") == "latest"


def test_text_format_sequence_and_ensemble() -> None:
    seq = text_format.Parse(SEQUENCE_CONFIG, model_config_pb2.ModelConfig())
    sb = seq.sequence_batching
    assert sb.WhichOneof("strategy_choice") == "direct"
    assert sb.direct.minimum_slot_utilization == pytest.approx(0.5)
    kinds = [ci.control[0].kind for ci in sb.control_input]
    Control = model_config_pb2.ModelSequenceBatching.Control
    assert kinds == [
        Control.CONTROL_SEQUENCE_START,
        Control.CONTROL_SEQUENCE_READY,
        Control.CONTROL_SEQUENCE_CORRID,
    ]
    assert list(sb.control_input[1].control[0].bool_false_true) == [False, True]
    assert sb.state[0].initial_state[0].WhichOneof("state_data") == "zero_data"

    ens = text_format.Parse(ENSEMBLE_CONFIG, model_config_pb2.ModelConfig())
    steps = ens.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["pre", "net"]
    assert steps[0].model_version == -1
    assert steps[0].input_map["RAW"] == "IN" and steps[1].output_map["Y"] == "OUT"
