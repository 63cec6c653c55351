"""Sequence control tensors (START / END / READY / CORRID) built from `sequence_batching.control_input`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from protos import model_config_pb2 as mc
from service.errors import ErrorCode, ServiceError
from service.types import InputTensor
from shm.tensor import serialize_bytes

Kind = mc.ModelSequenceBatching.Control

_CORRID_TYPES = {
    mc.TYPE_UINT64: ("UINT64", np.uint64, (1 << 64) - 1),
    mc.TYPE_INT64: ("INT64", np.int64, (1 << 64) - 1),
    mc.TYPE_UINT32: ("UINT32", np.uint32, (1 << 32) - 1),
    mc.TYPE_INT32: ("INT32", np.int32, (1 << 32) - 1),
}
_CORRID_BY_NAME = {v[0]: v for v in _CORRID_TYPES.values()}


@dataclass(slots=True, frozen=True)
class FlagControl:
    """A boolean-like control input (START, END or READY): its datatype and the bytes of false and true."""

    name: str
    kind: int
    datatype: str
    false: bytes
    true: bytes


@dataclass(slots=True, frozen=True)
class CorridControl:
    """The CORRID control input: the correlation id as the configured datatype."""

    name: str
    datatype: str  # UINT64 | INT64 | UINT32 | INT32 | BYTES

    def encode(self, sequence_id: int | str) -> bytes:
        """The correlation id's bytes (32-bit types truncate; strings as a one-element BYTES tensor)."""
        if self.datatype == "BYTES":
            return serialize_bytes([str(sequence_id).encode()])
        value = sequence_id if isinstance(sequence_id, int) else _string_id_as_int(sequence_id)
        _, np_type, mask = _CORRID_BY_NAME[self.datatype]
        value &= mask
        if np.issubdtype(np_type, np.signedinteger) and value > mask >> 1:
            value -= mask + 1
        return np.array([value], dtype=np_type).tobytes()


def _string_id_as_int(sequence_id: str) -> int:
    try:
        return int(sequence_id)
    except ValueError:
        return 0


@dataclass(slots=True, frozen=True)
class SequenceControls:
    """Every control input of a model, and the shape each injected tensor gets."""

    start: tuple[FlagControl, ...]
    end: tuple[FlagControl, ...]
    ready: tuple[FlagControl, ...]
    corrid: tuple[CorridControl, ...]
    shape: tuple[int, ...]  # [1] without batching, [1, 1] with

    def tensors(self, start: bool, end: bool, ready: bool, sequence_id: int | str) -> list[InputTensor]:
        """The control tensors of one request."""
        shape = list(self.shape)
        out = []
        for group, on in ((self.start, start), (self.end, end), (self.ready, ready)):
            for c in group:
                out.append(InputTensor(c.name, c.datatype, shape, c.true if on else c.false))
        for cc in self.corrid:
            out.append(InputTensor(cc.name, cc.datatype, shape, cc.encode(sequence_id)))
        return out


def _flag_control(model: str, name: str, control: mc.ModelSequenceBatching.Control) -> FlagControl:
    if len(control.int32_false_true) == 2:
        v = np.array(control.int32_false_true, dtype=np.int32)
        dt = "INT32"
    elif len(control.fp32_false_true) == 2:
        v = np.array(control.fp32_false_true, dtype=np.float32)
        dt = "FP32"
    elif len(control.bool_false_true) == 2:
        v = np.array(control.bool_false_true, dtype=np.bool_)
        dt = "BOOL"
    else:
        raise ServiceError(
            ErrorCode.INVALID_ARG,
            f"sequence batching control '{Kind.Kind.Name(control.kind)}' for model '{model}' must specify exactly "
            "one of int32_false_true, fp32_false_true or bool_false_true with two values",
        )
    return FlagControl(name, control.kind, dt, v[0:1].tobytes(), v[1:2].tobytes())


def build_controls(config: mc.ModelConfig) -> SequenceControls:
    """Read `sequence_batching.control_input`; raises ServiceError(INVALID_ARG) on a malformed entry."""
    groups: dict[int, list[FlagControl]] = {Kind.CONTROL_SEQUENCE_START: [], Kind.CONTROL_SEQUENCE_END: []}
    groups[Kind.CONTROL_SEQUENCE_READY] = []
    corrid: list[CorridControl] = []
    for ci in config.sequence_batching.control_input:
        for control in ci.control:
            if control.kind == Kind.CONTROL_SEQUENCE_CORRID:
                if control.data_type == mc.TYPE_STRING:
                    corrid.append(CorridControl(ci.name, "BYTES"))
                elif control.data_type in _CORRID_TYPES:
                    corrid.append(CorridControl(ci.name, _CORRID_TYPES[control.data_type][0]))
                else:
                    raise ServiceError(
                        ErrorCode.INVALID_ARG,
                        f"sequence batching CORRID control for model '{config.name}' must specify data_type "
                        "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING",
                    )
            elif control.kind in groups:
                groups[control.kind].append(_flag_control(config.name, ci.name, control))
    shape = (1, 1) if config.max_batch_size > 0 else (1,)
    return SequenceControls(
        tuple(groups[Kind.CONTROL_SEQUENCE_START]),
        tuple(groups[Kind.CONTROL_SEQUENCE_END]),
        tuple(groups[Kind.CONTROL_SEQUENCE_READY]),
        tuple(corrid),
        shape,
    )
