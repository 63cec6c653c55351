"""The PyTorch backend (platform pytorch_libtorch): a TorchScript model.pt run with torch.jit in the worker."""

from __future__ import annotations

import logging
import os
import re
import warnings
from typing import Any

import numpy as np

from service.worker.backends.base import (
    BackendContext,
    BackendError,
    BatchingBackend,
    config_parameter,
    default_thread_count,
)
from shm.tensor import CONFIG_TO_DATATYPE

try:
    import torch
except ImportError as e:  # the "torch" extra is not installed
    torch = None  # type: ignore[assignment]
    _IMPORT_ERROR: ImportError | None = e
else:
    _IMPORT_ERROR = None

log = logging.getLogger("trireme.worker.pytorch")

# Triton's naming convention for positional tensors: <name>__<index>
_INDEXED = re.compile(r"^(.*)__(\d+)$")
_TRUE = ("true", "1", "yes", "on")


def torch_datatypes() -> dict[str, Any]:
    """Protocol datatype -> torch dtype for every datatype the backend can move."""
    table = {
        "BOOL": torch.bool,
        "UINT8": torch.uint8,
        "INT8": torch.int8,
        "INT16": torch.int16,
        "INT32": torch.int32,
        "INT64": torch.int64,
        "FP16": torch.float16,
        "FP32": torch.float32,
        "FP64": torch.float64,
    }
    for name, attr in (("UINT16", "uint16"), ("UINT32", "uint32"), ("UINT64", "uint64")):
        if hasattr(torch, attr):
            table[name] = getattr(torch, attr)
    return table


def tensor_positions(names: list[str], arg_names: list[str], what: str, model: str) -> tuple[list[int], str]:
    """Position of each config tensor in forward()'s arguments (or the returned tuple) by Triton's rules.

    Names equal to forward() argument names map by name; otherwise `<name>__<index>` maps by index; when
    neither holds for every tensor, the config order is used. Returns (positions, rule).
    """
    if arg_names and all(n in arg_names for n in names):
        return [arg_names.index(n) for n in names], "argument names"
    matches = [_INDEXED.match(n) for n in names]
    if names and all(m is not None for m in matches):
        positions = [int(m.group(2)) for m in matches if m is not None]
        if len(set(positions)) != len(positions):
            raise BackendError(f"model '{model}': {what} names {names} repeat an index")
        return positions, "<name>__<index>"
    return list(range(len(names))), "configuration order"


class TorchBackend(BatchingBackend):
    """Backend for `platform: "pytorch_libtorch"` / `backend: "pytorch"` models."""

    def __init__(self, context: BackendContext) -> None:
        super().__init__(context)
        self.module: Any = None
        self.device: Any = None
        self.dict_input = False
        self.input_positions: dict[str, int] = {}
        self.output_positions: list[tuple[str, int, Any]] = []  # (name, index, expected torch dtype)
        self.inference_mode = True
        self.dtypes: dict[str, Any] = {}

    # ---- load --------------------------------------------------------------------------------------------
    def initialize(self) -> None:
        """Set threads, pick the device, torch.jit.load the model and map config tensors to its arguments."""
        ctx = self.context
        if torch is None:
            raise BackendError(
                f"model '{ctx.model_name}': the pytorch backend needs the 'torch' package, which is not installed "
                f"in the worker's environment ({_IMPORT_ERROR})"
            )
        config = ctx.config
        self.dtypes = torch_datatypes()
        self._set_threads(config)
        self.inference_mode = config_parameter(config, "INFERENCE_MODE", "true").lower() in _TRUE
        if config_parameter(config, "DISABLE_OPTIMIZED_EXECUTION", "false").lower() in _TRUE:
            torch._C._set_graph_executor_optimize(False)
        self.device = self._device()
        filename = config.get("default_model_filename") or "model.pt"
        path = os.path.join(ctx.version_dir, filename)
        if not os.path.isfile(path):
            raise BackendError(f"unable to load model '{ctx.model_name}': unable to find '{path}'")
        try:
            with warnings.catch_warnings():  # torch >= 2.9 deprecates TorchScript, which is what this platform is
                warnings.simplefilter("ignore", DeprecationWarning)
                self.module = torch.jit.load(path, map_location=self.device)
        except Exception as e:
            raise BackendError(f"unable to load model '{ctx.model_name}' from '{path}': {e}") from None
        self.module.eval()
        self._map_inputs()
        self._map_outputs()

    def _set_threads(self, config: dict[str, Any]) -> None:
        intra = int(config_parameter(config, "INTRA_OP_THREAD_COUNT", "0") or 0)
        inter = int(config_parameter(config, "INTER_OP_THREAD_COUNT", "0") or 0)
        torch.set_num_threads(intra if intra > 0 else default_thread_count(config))
        if inter > 0:
            try:
                torch.set_num_interop_threads(inter)
            except RuntimeError as e:  # only allowed before the first parallel work
                log.warning("INTER_OP_THREAD_COUNT ignored: %s", e)

    def _device(self) -> Any:
        ctx = self.context
        if ctx.instance_kind != "GPU":
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise BackendError(
                f"model '{ctx.model_name}': instance '{ctx.instance_name}' is KIND_GPU but this torch build has no "
                "CUDA support or no GPU is visible"
            )
        return torch.device("cuda", ctx.device_id)

    def _map_inputs(self) -> None:
        ctx = self.context
        arguments = list(self.module.forward.schema.arguments)[1:]  # drop self
        arg_names = [a.name for a in arguments]
        names = self.model_input_names()
        for t in self.config_inputs:
            datatype = CONFIG_TO_DATATYPE.get(t.get("data_type", ""), "")
            if datatype not in self.dtypes:
                raise BackendError(
                    f"model '{ctx.model_name}': input '{t['name']}' has data type {t.get('data_type')}, which the "
                    "pytorch backend does not support"
                )
        if len(arguments) == 1 and str(arguments[0].type).replace(" ", "") == "Dict[str,Tensor]":
            self.dict_input = True  # a single Dict[str, Tensor] argument: keys are the config names
            return
        required = [a.name for a in arguments if not a.has_default_value()]
        if len(names) < len(required) or len(names) > len(arguments):
            raise BackendError(
                f"unable to load model '{ctx.model_name}': configuration expects {len(names)} inputs, model's "
                f"forward() takes {len(arguments)} ({', '.join(arg_names)})"
            )
        positions, rule = tensor_positions(names, arg_names, "input", ctx.model_name)
        if any(p >= len(arguments) for p in positions):
            raise BackendError(
                f"unable to load model '{ctx.model_name}': input index out of range: {names} for forward() "
                f"arguments ({', '.join(arg_names)})"
            )
        self.input_positions = dict(zip(names, positions, strict=True))
        log.debug("model '%s' inputs mapped by %s: %s", ctx.model_name, rule, self.input_positions)

    def _map_outputs(self) -> None:
        ctx = self.context
        names = [t["name"] for t in self.config_outputs]
        positions, _rule = tensor_positions(names, [], "output", ctx.model_name)
        for t, index in zip(self.config_outputs, positions, strict=True):
            datatype = CONFIG_TO_DATATYPE.get(t.get("data_type", ""), "")
            if datatype not in self.dtypes:
                raise BackendError(
                    f"model '{ctx.model_name}': output '{t['name']}' has data type {t.get('data_type')}, which the "
                    "pytorch backend does not support"
                )
            self.output_positions.append((t["name"], index, self.dtypes[datatype]))

    # ---- execute -----------------------------------------------------------------------------------------
    def gather(self, name: str, parts: list[np.ndarray]) -> Any:
        """Write the group's input rows once into a fresh torch tensor (then move it to the device)."""
        first = parts[0]
        if len(parts) == 1:
            shape: tuple[int, ...] = tuple(first.shape)
        else:
            shape = (sum(int(p.shape[0]) for p in parts), *first.shape[1:])
        tensor = torch.from_numpy(np.empty(shape, dtype=first.dtype))
        host = tensor.numpy()
        if len(parts) == 1:
            host[...] = first
        else:
            pos = 0
            for part in parts:
                n = int(part.shape[0])
                host[pos : pos + n] = part
                pos += n
        if self.device.type != "cpu":
            tensor = tensor.to(self.device, non_blocking=False)
        return tensor

    def run(self, inputs: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
        """Call forward() once and return the config outputs as numpy arrays."""
        guard = torch.inference_mode() if self.inference_mode else torch.no_grad()
        with guard:
            if self.dict_input:
                result = self.module(inputs)
            else:
                args: list[Any] = [None] * (max(self.input_positions.values(), default=-1) + 1)
                for name, position in self.input_positions.items():
                    if name not in inputs:
                        raise BackendError(f"expected input '{name}' for model '{self.context.model_name}' is missing")
                    args[position] = inputs[name]
                result = self.module(*args)
            return self._outputs(result)

    def _outputs(self, result: Any) -> dict[str, np.ndarray]:
        model = self.context.model_name
        produced: Any
        if isinstance(result, dict):
            produced = result
            by_name = True
        else:
            produced = list(result) if isinstance(result, tuple | list) else [result]
            by_name = False
        out: dict[str, np.ndarray] = {}
        for name, index, dtype in self.output_positions:
            if by_name:
                if name not in produced:
                    raise BackendError(f"model '{model}' did not return output '{name}' (returned {list(produced)})")
                value = produced[name]
            else:
                if index >= len(produced):
                    raise BackendError(
                        f"model '{model}' returned {len(produced)} outputs, but the configuration expects output "
                        f"'{name}' at index {index}"
                    )
                value = produced[index]
            if not isinstance(value, torch.Tensor):
                raise BackendError(f"output '{name}' of model '{model}' is a {type(value).__name__}, not a Tensor")
            if value.dtype != dtype:
                raise BackendError(
                    f"configuration expects datatype {_config_type(dtype)} for output '{name}' of model '{model}', "
                    f"model provides {_config_type(value.dtype)}"
                )
            if value.device.type != "cpu":
                value = value.cpu()
            out[name] = value.numpy()
        return out


def _config_type(dtype: Any) -> str:
    for name, candidate in torch_datatypes().items():
        if candidate == dtype:
            return f"TYPE_{name}"
    return str(dtype)
