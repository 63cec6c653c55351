"""The model of a bound function, as the Python backend runs it (in a worker process, or on a thread of the
server with in_process=True): each batch of requests becomes a list of Request mappings, the function's answer
is checked against the declared outputs, and each request gets its response(s) or an error that says why.

Imported by the generated model.py; it uses only numpy, shm and triton_python_backend_utils (no server code)."""

from __future__ import annotations

import inspect
import json
import logging
import os
import pickle
import sys
import traceback
from typing import Any

import numpy as np

from shm.tensor import DATATYPE_TO_NUMPY
from trireme.bind.request import Request

log = logging.getLogger("trireme.bind")

SPEC_FILE = "bind.json"
PICKLE_FILE = "callable.pkl"
# functions bound with in_process=True, by token: the model reaches them in this process without pickling
LOCAL: dict[str, list[Any]] = {}


class BindError(Exception):
    """A function's answer that does not fit its declaration (the request gets this message as its error)."""


def load_callables(folder: str, spec: dict[str, Any]) -> list[Any]:
    """The bound function(s): by in-process token, or unpickled from the model folder."""
    token = spec.get("local")
    if token:
        if token not in LOCAL:
            raise RuntimeError(f"in-process function '{token}' is not bound in this process")
        return LOCAL[token]
    for entry in spec.get("sys_path", []):  # the binding process's import path: modules the pickle refers to
        if entry and entry not in sys.path:
            sys.path.append(entry)
    with open(os.path.join(folder, PICKLE_FILE), "rb") as f:
        try:
            return list(pickle.load(f))
        except Exception as e:
            raise RuntimeError(
                f"cannot load the bound function in the worker process ({type(e).__name__}: {e}); make it "
                "importable there (a module on the worker's sys.path) or bind it with in_process=True"
            ) from None


def _instance_index(instance_name: str) -> int:
    tail = instance_name.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else 0


class TritonPythonModel:
    """The Python-backend model every bound function is served by."""

    def initialize(self, args: dict[str, str]) -> None:
        folder = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(folder, SPEC_FILE)) as f:
            spec = json.load(f)
        functions = load_callables(folder, spec)
        self.fn = functions[_instance_index(args.get("model_instance_name", "")) % len(functions)]
        self.name = args["model_name"]
        self.outputs: list[dict[str, Any]] = spec["outputs"]
        self.batched: bool = spec["batched"]
        self.decoupled: bool = spec["decoupled"]
        self.strict: bool = spec["strict"]
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils

    # ---- requests in ---------------------------------------------------------------------------------------
    def _request(self, r: Any) -> Request:
        data = {t.name(): t.as_numpy() for t in r.inputs()}
        try:
            parameters = json.loads(r.parameters() or "{}")
        except ValueError:
            parameters = {}
        return Request(data, parameters, list(r.requested_output_names()))

    # ---- answers out -------------------------------------------------------------------------------------
    def _array(self, declared: dict[str, Any], value: Any) -> np.ndarray:
        name, datatype, dims = declared["name"], declared["datatype"], declared["dims"]
        array = np.asarray(value)
        if datatype == "BYTES":
            if array.dtype.kind not in ("O", "S", "U"):
                raise BindError(f"output '{name}' is {array.dtype}, the model declares BYTES")
            array = array.astype(np.object_)
        else:
            want = DATATYPE_TO_NUMPY[datatype]
            if array.dtype != want:
                if self.strict or not np.can_cast(array.dtype, want, "same_kind"):
                    raise BindError(f"output '{name}' is {array.dtype}, the model declares {datatype} ({want})")
                array = array.astype(want)
        shape = ([-1] if self.batched else []) + list(dims)
        if array.ndim != len(shape) or any(d >= 0 and d != s for d, s in zip(shape, array.shape, strict=True)):
            raise BindError(f"output '{name}' has shape {list(array.shape)}, the model declares {shape}")
        return array

    def _response(self, request: Request, outputs: Any) -> Any:
        """A pb_utils.InferenceResponse for one request's outputs (a dict by name, or a list in declared order)."""
        pb = self.pb
        if isinstance(outputs, (list, tuple)):
            if len(outputs) != len(self.outputs):
                raise BindError(
                    f"returned {len(outputs)} outputs for a request, the model declares {len(self.outputs)}"
                )
            outputs = {d["name"]: v for d, v in zip(self.outputs, outputs, strict=True)}
        if not isinstance(outputs, dict):
            raise BindError(f"each request's outputs must be a dict (or a list), not {type(outputs).__name__}")
        declared = {d["name"]: d for d in self.outputs}
        unknown = [k for k in outputs if k not in declared]
        if unknown:
            raise BindError(f"returned output(s) {unknown} the model does not declare ({list(declared)})")
        wanted = request.requested_output_names or list(declared)
        missing = [n for n in wanted if n not in outputs]
        if missing:
            raise BindError(f"did not return output(s) {missing}")
        tensors = [pb.Tensor(n, self._array(declared[n], outputs[n])) for n in wanted]
        return pb.InferenceResponse(output_tensors=tensors)

    def _error(self, e: BaseException) -> Any:
        if isinstance(e, BindError):
            text = f"model '{self.name}': {e}"
        else:
            log.error("model '%s' raised:\n%s", self.name, "".join(traceback.format_exception(e)))
            text = f"model '{self.name}' raised {type(e).__name__}: {e}"
        return self.pb.InferenceResponse(error=self.pb.TritonError(text))

    def _responses(self, requests: list[Request], result: Any) -> list[Any]:
        """One response per request from the function's answer to the batch."""
        if inspect.isgenerator(result) or inspect.isasyncgen(result):
            err = BindError("returned a generator: streaming needs ModelConfig(decoupled=True)")
            return [self._error(err) for _ in requests]
        if not isinstance(result, (list, tuple)) or len(result) != len(requests):
            got = f"{len(result)} items" if isinstance(result, (list, tuple)) else type(result).__name__
            err = BindError(f"must return a list with one item per request ({len(requests)}), got {got}")
            return [self._error(err) for _ in requests]
        out = []
        for request, outputs in zip(requests, result, strict=True):
            try:
                out.append(self._response(request, outputs))
            except Exception as e:
                out.append(self._error(e))
        return out

    def execute(self, pb_requests: list[Any]) -> Any:
        requests = [self._request(r) for r in pb_requests]
        try:
            result = self.fn(requests)
        except Exception as e:
            if self.decoupled:
                self._finish_all(pb_requests, self._error(e))
                return None
            return [self._error(e) for _ in requests]
        if self.decoupled:
            return self._stream(pb_requests, requests, result)
        if inspect.isawaitable(result):
            return self._awaited(requests, result)
        return self._responses(requests, result)

    async def _awaited(self, requests: list[Request], pending: Any) -> list[Any]:
        try:
            result = await pending
        except Exception as e:
            return [self._error(e) for _ in requests]
        return self._responses(requests, result)

    # ---- decoupled -------------------------------------------------------------------------------------
    def _finish_all(self, pb_requests: list[Any], last: Any = None) -> None:
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for r in pb_requests:
            r.get_response_sender().send(last, flags=final)

    def _send(self, pb_requests: list[Any], requests: list[Request], item: Any) -> None:
        for sender_request, response in zip(pb_requests, self._responses(requests, item), strict=True):
            sender_request.get_response_sender().send(response)

    def _stream(self, pb_requests: list[Any], requests: list[Request], result: Any) -> Any:
        """Decoupled: each item the function yields (one answer per request) is one response per request, then
        the final flag. Async generators and coroutines run on the instance's event loop."""
        if inspect.isasyncgen(result) or inspect.isawaitable(result):
            return self._stream_async(pb_requests, requests, result)
        try:
            for item in result if inspect.isgenerator(result) else [result]:
                self._send(pb_requests, requests, item)
        except Exception as e:
            self._finish_all(pb_requests, self._error(e))
            return None
        self._finish_all(pb_requests)
        return None

    async def _stream_async(self, pb_requests: list[Any], requests: list[Request], result: Any) -> None:
        try:
            if inspect.isasyncgen(result):
                async for item in result:
                    self._send(pb_requests, requests, item)
            else:
                self._send(pb_requests, requests, await result)
        except Exception as e:
            self._finish_all(pb_requests, self._error(e))
            return
        self._finish_all(pb_requests)
