"""Implicit sequence state (`sequence_batching.state`): the server keeps each sequence's state tensor.

The state enters every request of the sequence as the input `input_name` (the initial state on START) and
the model's output `output_name` becomes the state the next request sees. Triton offers this only for some
C++ backends; here it works for every backend, the Python backend included.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from protos import model_config_pb2 as mc
from service.errors import ErrorCode, ServiceError
from service.types import InputTensor, OutputTensor
from shm.tensor import CONFIG_TO_DATATYPE, ELEMENT_SIZE, element_count


@dataclass(slots=True)
class StateValue:
    """One state tensor's current value."""

    datatype: str
    shape: list[int]
    data: bytes


@dataclass(slots=True, frozen=True)
class StateSpec:
    """One `state` entry: the names, and the initial value (without the batch dim)."""

    input_name: str
    output_name: str
    initial: StateValue


def _initial_value(config: mc.ModelConfig, model_dir: str, state: mc.ModelSequenceBatching.State) -> StateValue:
    datatype = CONFIG_TO_DATATYPE.get(mc.DataType.Name(state.data_type), "")
    if not datatype:
        raise ServiceError(
            ErrorCode.INVALID_ARG, f"state '{state.input_name}' of model '{config.name}' has no data_type"
        )
    if state.initial_state:
        init = state.initial_state[0]
        dims = [max(0, d) for d in init.dims]
        if init.HasField("data_file"):
            path = os.path.join(model_dir, "initial_state", init.data_file)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise ServiceError(
                    ErrorCode.INVALID_ARG,
                    f"failed to read initial state '{init.name}' of model '{config.name}': {e}",
                ) from None
            return StateValue(datatype, dims, data)
    else:
        dims = [d if d >= 0 else 1 for d in state.dims]
    if datatype == "BYTES":
        return StateValue(datatype, dims, b"\0\0\0\0" * element_count(dims))
    return StateValue(datatype, dims, bytes(ELEMENT_SIZE[datatype] * element_count(dims)))


def build_states(config: mc.ModelConfig, model_dir: str) -> tuple[StateSpec, ...]:
    """Every `state` entry of the config."""
    return tuple(
        StateSpec(s.input_name, s.output_name, _initial_value(config, model_dir, s))
        for s in config.sequence_batching.state
    )


class SequenceState:
    """The state tensors of one live sequence."""

    __slots__ = ("batched", "specs", "values")

    def __init__(self, specs: tuple[StateSpec, ...], batched: bool) -> None:
        self.specs = specs
        self.batched = batched
        self.values: dict[str, StateValue] = {}
        self.reset()

    def reset(self) -> None:
        """Back to the initial state (a START request)."""
        self.values = {s.output_name: s.initial for s in self.specs}

    def inputs(self) -> list[InputTensor]:
        """The state as input tensors of the next request."""
        out = []
        for s in self.specs:
            v = self.values[s.output_name]
            shape = ([1, *v.shape]) if self.batched and v is s.initial else list(v.shape)
            out.append(InputTensor(s.input_name, v.datatype, shape, v.data))
        return out

    def capture(self, outputs: list[OutputTensor]) -> list[OutputTensor]:
        """Take the state outputs out of a response (they become the state); returns the remaining outputs."""
        if not any(o.name in self.values for o in outputs):
            return outputs
        kept = []
        for o in outputs:
            if o.name in self.values and o.data is not None:
                self.values[o.name] = StateValue(o.datatype, list(o.shape), bytes(o.data))
            else:
                kept.append(o)
        return kept
