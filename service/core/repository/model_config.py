"""config.pbtxt: parse (protobuf text format), normalize the way Triton does, validate, and render as JSON."""

from __future__ import annotations

import json
import os
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from protos import model_config_pb2 as mc
from service.core.repository.batch_io import validate_batch_io
from service.errors import ErrorCode, ServiceError

ModelConfig = mc.ModelConfig

# platform -> (backend, default model file)
PLATFORM_BACKENDS: dict[str, tuple[str, str]] = {
    "tensorrt_plan": ("tensorrt", "model.plan"),
    "onnxruntime_onnx": ("onnxruntime", "model.onnx"),
    "pytorch_libtorch": ("pytorch", "model.pt"),
    "libtorch": ("pytorch", "model.pt"),
    "torch_aoti": ("pytorch", "model.pt2"),
    "tensorflow_graphdef": ("tensorflow", "model.graphdef"),
    "tensorflow_savedmodel": ("tensorflow", "model.savedmodel"),
}
BACKEND_FILES: dict[str, str] = {
    "python": "model.py",
    "pytorch": "model.pt",
    "onnxruntime": "model.onnx",
    "tensorrt": "model.plan",
    "openvino": "model.xml",
    "tensorflow": "model.savedmodel",
    "dali": "model.dali",
    "fil": "",  # FIL picks its file from model_type (xgboost.json, model.txt, ...) when this is not set
}
# which backend owns a model file, for configs that name neither platform nor backend
FILE_BACKENDS: list[tuple[str, str, str]] = [
    ("model.plan", "tensorrt", "tensorrt_plan"),
    ("model.onnx", "onnxruntime", "onnxruntime_onnx"),
    ("model.pt", "pytorch", "pytorch_libtorch"),
    ("model.savedmodel", "tensorflow", "tensorflow_savedmodel"),
    ("model.graphdef", "tensorflow", "tensorflow_graphdef"),
    ("model.py", "python", ""),
]
_INT64_TYPES = (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64)


def config_error(path: str, message: str) -> ServiceError:
    """An INVALID_ARG load error that names the config file."""
    return ServiceError(ErrorCode.INVALID_ARG, f"{path}: {message}")


def parse_config_text(text: str, path: str) -> mc.ModelConfig:
    """Parse config.pbtxt text; parse errors name the file, line, column and field."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise config_error(path, f"failed to parse model configuration: {e}") from None
    return config


def read_config(model_dir: str, config_name: str = "") -> tuple[mc.ModelConfig, str, bool]:
    """Read `<model_dir>/config.pbtxt` (or configs/<name>.pbtxt). Returns (config, path, file_existed)."""
    path = os.path.join(model_dir, "config.pbtxt")
    if config_name:
        custom = os.path.join(model_dir, "configs", f"{config_name}.pbtxt")
        if os.path.isfile(custom):
            path = custom
    if not os.path.isfile(path):
        return mc.ModelConfig(), path, False
    with open(path, encoding="utf-8") as f:
        return parse_config_text(f.read(), path), path, True


def fill_backend(config: mc.ModelConfig, model_dir: str, versions: list[int]) -> None:
    """Fill backend and default_model_filename from the platform, the files present, or the dir name."""
    if config.platform == "ensemble":
        return
    if config.platform in PLATFORM_BACKENDS and not config.backend:
        config.backend = PLATFORM_BACKENDS[config.platform][0]
    if not config.platform and not config.backend:
        for version in versions[:1]:
            vdir = os.path.join(model_dir, str(version))
            for filename, backend, platform in FILE_BACKENDS:
                if os.path.exists(os.path.join(vdir, filename)):
                    config.backend, config.platform = backend, platform
                    break
    if not config.platform and not config.backend and "." in os.path.basename(model_dir):
        config.backend = os.path.basename(model_dir).rsplit(".", 1)[1]
    if config.backend == "pytorch" and not config.platform:
        config.platform = "pytorch_libtorch"
    if config.backend == "onnxruntime" and not config.platform:
        config.platform = "onnxruntime_onnx"
    if config.backend == "tensorrt" and not config.platform:
        config.platform = "tensorrt_plan"
    if config.backend == "tensorflow" and not config.platform:
        config.platform = _tensorflow_platform(config, model_dir, versions)
    if not config.default_model_filename:
        if config.platform in PLATFORM_BACKENDS:
            config.default_model_filename = PLATFORM_BACKENDS[config.platform][1]
        elif config.backend:
            # "" for other backends (Python-based ones, --backend-directory), as Triton's ModelConfig shows
            config.default_model_filename = BACKEND_FILES.get(config.backend, "")


def _tensorflow_platform(config: mc.ModelConfig, model_dir: str, versions: list[int]) -> str:
    """Triton's rule for `backend: "tensorflow"` without a platform: the file name, else what the version holds."""
    for platform in ("tensorflow_savedmodel", "tensorflow_graphdef"):
        if config.default_model_filename == PLATFORM_BACKENDS[platform][1]:
            return platform
    for version in versions[:1]:
        vdir = os.path.join(model_dir, str(version))
        if os.path.isfile(os.path.join(vdir, "model.graphdef")):
            return "tensorflow_graphdef"
        if os.path.isdir(os.path.join(vdir, "model.savedmodel")):
            return "tensorflow_savedmodel"
    return ""


def normalize(config: mc.ModelConfig, model_name: str, gpu_count: int = 0) -> None:
    """Apply Triton's defaults (what its ModelConfig RPC shows) in place. Call after fill_backend and auto-complete."""
    if not config.name:
        config.name = model_name
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    db = config.dynamic_batching
    if config.HasField("dynamic_batching") and config.max_batch_size > 0 and not db.preferred_batch_size:
        db.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        sb = config.sequence_batching
        if sb.max_sequence_idle_microseconds == 0:
            sb.max_sequence_idle_microseconds = 1_000_000
        if sb.HasField("oldest") and not sb.oldest.preferred_batch_size and config.max_batch_size > 0:
            sb.oldest.preferred_batch_size.append(config.max_batch_size)
        if not sb.HasField("oldest") and not sb.HasField("direct"):
            sb.direct.SetInParent()
    if config.platform == "ensemble":
        return
    opt = config.optimization
    if not opt.HasField("input_pinned_memory"):
        opt.input_pinned_memory.enable = True
    if not opt.HasField("output_pinned_memory"):
        opt.output_pinned_memory.enable = True
    if not config.instance_group:
        group = config.instance_group.add()
        group.kind = mc.ModelInstanceGroup.KIND_AUTO
        group.name = config.name  # Triton names the group it adds after the model: its instance is '<model>_0'
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_GPU if gpu_count > 0 else mc.ModelInstanceGroup.KIND_CPU
        if group.count < 1:
            group.count = 1
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(range(gpu_count))


def validate(config: mc.ModelConfig, model_name: str, path: str) -> None:
    """Check the normalized config; errors name the file and the offending field."""
    if config.name != model_name:
        raise config_error(path, f"'name' is '{config.name}' but the model directory is '{model_name}'")
    if config.max_batch_size < 0:
        raise config_error(path, f"'max_batch_size' must be non-negative, got {config.max_batch_size}")
    if config.platform == "ensemble":
        if config.backend:
            raise config_error(path, "ensemble models must not set 'backend'")
        if not config.HasField("ensemble_scheduling"):
            raise config_error(path, "ensemble models must set 'ensemble_scheduling'")
    elif not config.platform and not config.backend:
        raise config_error(path, "must specify 'platform' or 'backend' for model '" + model_name + "'")
    names: set[str] = set()
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for t in tensors:
            if not t.name:
                raise config_error(path, f"model {kind} must specify 'name'")
            if (kind, t.name) in names:
                raise config_error(path, f"duplicate {kind} name '{t.name}'")
            names.add((kind, t.name))  # type: ignore[arg-type]
            if t.data_type == mc.TYPE_INVALID:
                raise config_error(path, f"{kind} '{t.name}' must specify 'data_type'")
            if not t.dims and not (t.HasField("reshape")):
                raise config_error(path, f"{kind} '{t.name}' must specify 'dims'")
            for d in t.dims:
                if d < -1:
                    raise config_error(path, f"{kind} '{t.name}' has invalid dimension {d} in 'dims'")
    if config.HasField("dynamic_batching"):
        db = config.dynamic_batching
        for size in db.preferred_batch_size:
            if size <= 0 or (config.max_batch_size > 0 and size > config.max_batch_size):
                raise config_error(
                    path,
                    f"dynamic_batching.preferred_batch_size {size} must be in [1, max_batch_size="
                    f"{config.max_batch_size}]",
                )
        if db.priority_levels and not 1 <= db.default_priority_level <= db.priority_levels:
            raise config_error(
                path,
                f"dynamic_batching.default_priority_level must be in [1, {db.priority_levels}], "
                f"got {db.default_priority_level}",
            )
        for level in db.priority_queue_policy:
            if not 1 <= level <= db.priority_levels:
                raise config_error(path, f"dynamic_batching.priority_queue_policy has unknown level {level}")
        if db.preserve_ordering and db.priority_levels > 1:
            raise config_error(path, "dynamic_batching.preserve_ordering allows only one priority level")
    for group in config.instance_group:
        if group.count < 1:
            raise config_error(path, f"instance_group '{group.name}' count must be >= 1")
    validate_batch_io(config)


def to_json_dict(message: Message) -> dict[str, Any]:
    """Protobuf JSON as Triton prints it: proto field names, defaults printed, enums by name, int64 as numbers."""
    raw = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_to_numbers(message.DESCRIPTOR, raw)
    return raw


def to_json(message: Message) -> str:
    """to_json_dict as a compact JSON string (what python models receive as args['model_config'])."""
    return json.dumps(to_json_dict(message), separators=(",", ":"))


def from_json(text: str | dict[str, Any]) -> mc.ModelConfig:
    """Parse a JSON config (e.g. from auto_complete_config or a load request) into a ModelConfig."""
    config = mc.ModelConfig()
    data = json.loads(text) if isinstance(text, str) else text
    json_format.ParseDict(data, config, ignore_unknown_fields=True)
    return config


def _int64_to_numbers(descriptor: Any, data: dict[str, Any]) -> None:
    """Turn MessageToDict's int64 strings back into numbers, recursively (map keys stay strings)."""
    for field in descriptor.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                for k, v in value.items():
                    if value_field.message_type is not None:
                        _int64_to_numbers(value_field.message_type, v)
                    elif value_field.type in _INT64_TYPES:
                        value[k] = int(v)
            elif field.label == FieldDescriptor.LABEL_REPEATED:
                for item in value:
                    _int64_to_numbers(field.message_type, item)
            else:
                _int64_to_numbers(field.message_type, value)
        elif field.type in _INT64_TYPES:
            data[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
