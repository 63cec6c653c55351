"""A model version's signature (what requests are checked against) and the model-version string rule.

Built when a model loads (repository) and used by request validation (pipeline), so it lives here, below both.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import ErrorCode, ServiceError
from shm.tensor import CONFIG_TO_DATATYPE


@dataclass(slots=True, frozen=True)
class TensorSpec:
    """An input or output as the config declares it (protocol datatype, dims without the batch dim)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False


@dataclass(slots=True)
class ModelSignature:
    """What requests to one model version are checked against."""

    model_name: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    required_inputs: tuple[str, ...]
    # inputs the server supplies itself (sequence control tensors, implicit state): clients must not send them
    internal_inputs: frozenset[str] = frozenset()


def tensor_spec(name: str, data_type_enum_name: str, dims: list[int], optional: bool = False) -> TensorSpec:
    """TensorSpec from config values (data_type as its enum name, e.g. 'TYPE_FP32')."""
    return TensorSpec(name, CONFIG_TO_DATATYPE.get(data_type_enum_name, "INVALID"), tuple(dims), optional)


INT64_MAX = (1 << 63) - 1


def parse_version(version: str) -> int:
    """A requested model version: ASCII digits only ("-1", "+1", full-width or Arabic-Indic digits are rejected)."""
    if version.isascii() and version.isdigit():
        # Triton parses with stoll: beyond int64 is out of range (and int() of 4300+ digits would raise)
        if len(version.lstrip("0")) > 19 or int(version) > INT64_MAX:
            # a huge string is shortened: a gRPC status over the metadata limit would reach the client as
            # RESOURCE_EXHAUSTED instead of this error
            shown = version if len(version) <= 64 else f"{version[:32]}...({len(version)} digits)"
            raise ServiceError(
                ErrorCode.INVALID_ARG,
                f"failed to get model version from specified version string '{shown}' (details: stoll), "
                "version should be an integral value > 0",
            )
        return int(version)
    if version[:1] == "-" and version[1:].isascii() and version[1:].isdigit():
        raise ServiceError(
            ErrorCode.INVALID_ARG,
            f"invalid model version specified '{version}' , version should be an integral value > 0",
        )
    raise ServiceError(
        ErrorCode.INVALID_ARG,
        f"failed to get model version from specified version string '{version}' (details: only the ASCII digits "
        "0-9 are allowed), version should be an integral value > 0",
    )
