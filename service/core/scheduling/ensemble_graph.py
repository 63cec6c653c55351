"""Ensemble graphs: parse `ensemble_scheduling` steps and validate them, alone and against composing models.

Vocabulary (Triton's ensemble_scheduling): a step's input_map is {composing model input: ensemble tensor}, its
output_map {composing model output: ensemble tensor}. Ensemble tensors are the ensemble's inputs and outputs plus every
map value. Errors are INVALID_ARG and name the ensemble, the step (index and model) and the tensor.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protos import model_config_pb2 as mc
from service.errors import ErrorCode, ServiceError


@dataclass(slots=True, frozen=True)
class Step:
    """One step of an ensemble."""

    index: int
    model_name: str
    model_version: str  # "" = latest ready version (config value -1)
    inputs: dict[str, str]  # composing model input -> ensemble tensor
    outputs: dict[str, str]  # composing model output -> ensemble tensor

    def label(self) -> str:
        """'step 1 (model 'x')' for error messages."""
        return f"step {self.index} (model '{self.model_name}')"


@dataclass(slots=True, frozen=True)
class TensorType:
    """Datatype and full shape (with -1 batch dim when batching) of an ensemble tensor as one side sees it."""

    data_type: int
    shape: tuple[int, ...]
    origin: str  # who says so, for messages


def _error(ensemble: str, message: str) -> ServiceError:
    return ServiceError(ErrorCode.INVALID_ARG, f"ensemble '{ensemble}': {message}")


def step_key(model_name: str, model_namespace: str) -> str:
    """The repository key of a step's model: its name, or <namespace>/<name> when --model-namespacing resolved it
    to one repository's model of a name several repositories hold."""
    return os.path.join(model_namespace, model_name) if model_namespace else model_name


def parse_steps(config: mc.ModelConfig) -> list[Step]:
    """The steps of an ensemble config, in config order."""
    return [
        Step(
            i,
            step_key(s.model_name, s.model_namespace),
            "" if s.model_version < 0 else str(s.model_version),
            dict(s.input_map),
            dict(s.output_map),
        )
        for i, s in enumerate(config.ensemble_scheduling.step)
    ]


def validate_graph(config: mc.ModelConfig) -> list[Step]:
    """Structural checks that need no other model: steps present, each tensor produced once, every step input
    available, every ensemble output produced, every ensemble input used, no cycle. Returns the steps."""
    name = config.name
    steps = parse_steps(config)
    if not steps:
        raise _error(name, "'ensemble_scheduling' must have at least one step")
    inputs = {t.name for t in config.input}
    producer: dict[str, Step] = {}
    for step in steps:
        if not step.model_name:
            raise _error(name, f"step {step.index} must set 'model_name'")
        if step.model_name == name:
            raise _error(name, f"{step.label()} refers to the ensemble itself")
        for model_output, tensor in step.outputs.items():
            if tensor in inputs:
                raise _error(
                    name,
                    f"{step.label()} output '{model_output}' maps to ensemble tensor '{tensor}', which is an "
                    "ensemble input: every ensemble tensor must be produced exactly once",
                )
            if tensor in producer:
                raise _error(
                    name,
                    f"{step.label()} output '{model_output}' maps to ensemble tensor '{tensor}', which "
                    f"{producer[tensor].label()} already produces: every ensemble tensor must be produced exactly "
                    "once",
                )
            producer[tensor] = step
    consumed: set[str] = set()
    for step in steps:
        for model_input, tensor in step.inputs.items():
            consumed.add(tensor)
            if tensor not in inputs and tensor not in producer:
                raise _error(
                    name,
                    f"{step.label()} input '{model_input}' reads ensemble tensor '{tensor}', which is neither an "
                    "ensemble input nor produced by any step",
                )
    for t in config.output:
        if t.name not in producer:
            raise _error(name, f"ensemble output '{t.name}' is not produced by any step")
    for tensor in sorted(inputs - consumed):
        raise _error(name, f"ensemble input '{tensor}' is not used by any step")
    _check_acyclic(name, steps, producer)
    return steps


def _check_acyclic(name: str, steps: list[Step], producer: dict[str, Step]) -> None:
    """Depth-first search over 'step reads a tensor another step produces'; report the first cycle found."""
    state: dict[int, int] = {}  # 1 = on the current path, 2 = done
    path: list[tuple[Step, str]] = []

    def visit(step: Step) -> None:
        state[step.index] = 1
        for tensor in step.inputs.values():
            up = producer.get(tensor)
            if up is None:
                continue
            path.append((step, tensor))
            if state.get(up.index) == 1:
                start = next(i for i, (s, _) in enumerate(path) if s.index == up.index)
                links = " -> ".join(f"{s.label()} reads '{t}'" for s, t in path[start:])
                raise _error(name, f"the steps form a cycle: {links} from {up.label()}")
            if state.get(up.index) is None:
                visit(up)
            path.pop()
        state[step.index] = 2

    for step in steps:
        if step.index not in state:
            visit(step)


def _full_shape(config: Any, dims: Any) -> tuple[int, ...]:
    return ((-1,) if config.max_batch_size > 0 else ()) + tuple(dims)


def _shapes_compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def _type_name(data_type: int) -> str:
    return str(mc.DataType.Name(data_type))  # type: ignore[arg-type]


def validate_models(config: mc.ModelConfig, steps: list[Step], lookup: Callable[[Step], mc.ModelConfig]) -> None:
    """Checks against the composing models: present, mapped names exist, required inputs mapped, datatypes and
    shapes agree along every ensemble tensor, batch sizes fit. `lookup(step)` returns the step model's config
    or raises ServiceError."""
    name = config.name
    types: dict[str, TensorType] = {
        t.name: TensorType(t.data_type, _full_shape(config, t.dims), f"ensemble input '{t.name}'") for t in config.input
    }
    configs: dict[int, mc.ModelConfig] = {}
    for step in steps:
        try:
            configs[step.index] = lookup(step)
        except ServiceError as e:
            raise _error(name, f"{step.label()} is not available: {e.message}") from None
    order = _topological(steps, {t for s in steps for t in s.outputs.values()})
    for step in order:
        sub = configs[step.index]
        if config.max_batch_size > 0 and sub.max_batch_size < config.max_batch_size:
            raise _error(
                name,
                f"ensemble max_batch_size {config.max_batch_size} is larger than {step.label()} "
                f"max_batch_size {sub.max_batch_size}",
            )
        sub_inputs = {t.name: t for t in sub.input}
        for model_input, tensor in step.inputs.items():
            spec = sub_inputs.get(model_input)
            if spec is None:
                raise _error(name, f"{step.label()}: input_map key '{model_input}' is not an input of the model")
            _agree(
                name,
                tensor,
                types.get(tensor),
                TensorType(spec.data_type, _full_shape(sub, spec.dims), f"{step.label()} input '{model_input}'"),
            )
        for t in sub.input:
            if not t.optional and t.name not in step.inputs:
                raise _error(name, f"{step.label()}: required input '{t.name}' is not in input_map")
        sub_outputs = {t.name: t for t in sub.output}
        for model_output, tensor in step.outputs.items():
            spec_out = sub_outputs.get(model_output)
            if spec_out is None:
                raise _error(name, f"{step.label()}: output_map key '{model_output}' is not an output of the model")
            types[tensor] = TensorType(
                spec_out.data_type, _full_shape(sub, spec_out.dims), f"{step.label()} output '{model_output}'"
            )
    for edge in config.output:
        _agree(
            name,
            edge.name,
            types.get(edge.name),
            TensorType(edge.data_type, _full_shape(config, edge.dims), f"ensemble output '{edge.name}'"),
        )


def _agree(name: str, tensor: str, have: TensorType | None, want: TensorType) -> None:
    if have is None:
        return
    if have.data_type != want.data_type:
        raise _error(
            name,
            f"ensemble tensor '{tensor}' is {_type_name(have.data_type)} from {have.origin} but "
            f"{_type_name(want.data_type)} for {want.origin}",
        )
    if not _shapes_compatible(have.shape, want.shape):
        raise _error(
            name,
            f"ensemble tensor '{tensor}' has shape {list(have.shape)} from {have.origin} but {want.origin} "
            f"expects {list(want.shape)}",
        )


def _topological(steps: list[Step], produced: set[str]) -> list[Step]:
    """Steps ordered so every producer comes before its consumers (the graph is known to be acyclic)."""
    done: set[str] = set()
    left = list(steps)
    order: list[Step] = []
    while left:
        ready = [s for s in left if all(t in done or t not in produced for t in s.inputs.values())]
        for s in ready:
            order.append(s)
            done.update(s.outputs.values())
            left.remove(s)
        if not ready:  # cannot happen after validate_graph; keep the rest in config order
            order.extend(left)
            break
    return order


def step_model_names(config: mc.ModelConfig) -> set[str]:
    """Names of the models an ensemble's steps use."""
    return {step_key(s.model_name, s.model_namespace) for s in config.ensemble_scheduling.step if s.model_name}
