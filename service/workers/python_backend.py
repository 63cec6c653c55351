"""The Python backend: runs an unmodified Triton `model.py` (class TritonPythonModel) inside the worker."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import os
import sys
from types import ModuleType
from typing import Any

from service.errors import ErrorCode
from service.workers.backend import Backend, BackendContext, WorkerRequest
from service.workers.pb_stub import triton_python_backend_utils as pb_utils

PB_UTILS_NAME = "triton_python_backend_utils"


def import_model_module(model_dir: str, version_dir: str, filename: str) -> ModuleType:
    """Import <version_dir>/<filename> the way Triton does (model and version dirs on sys.path)."""
    sys.modules[PB_UTILS_NAME] = pb_utils
    pb_utils.runtime.model_dir = version_dir
    path = os.path.join(version_dir, filename)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"unable to find model file '{path}'")
    for entry in (model_dir, version_dir):
        if entry not in sys.path:
            sys.path.append(entry)
    spec = importlib.util.spec_from_file_location(f"{os.path.basename(version_dir)}.model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "TritonPythonModel"):
        raise AttributeError(f"'{path}' does not define class TritonPythonModel")
    return module


class PythonBackend(Backend):
    """Backend for `backend: "python"` models."""

    def __init__(self, context: BackendContext) -> None:
        super().__init__(context)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(context.config)
        self.model: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def initialize(self) -> None:
        """Import model.py, instantiate TritonPythonModel and call initialize(args)."""
        ctx = self.context
        pb_utils.runtime.bls = ctx.bls
        filename = ctx.config.get("default_model_filename") or "model.py"
        module = import_model_module(ctx.model_dir, ctx.version_dir, filename)
        self.model = module.TritonPythonModel()
        args = {
            "model_config": ctx.config_json,
            "model_instance_kind": ctx.instance_kind,
            "model_instance_name": ctx.instance_name,
            "model_instance_device_id": str(ctx.device_id),
            "model_repository": ctx.model_dir,
            "model_version": ctx.model_version,
            "model_name": ctx.model_name,
        }
        init = getattr(self.model, "initialize", None)
        if init is not None:
            self._run(init(args))

    def _run(self, result: Any) -> Any:
        """Await coroutines on the stub's own event loop (async initialize/execute/finalize)."""
        if not inspect.isawaitable(result):
            return result
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(result)

    def execute(self, requests: list[WorkerRequest]) -> None:
        """Hand the batch to model.execute as a list of pb_utils.InferenceRequest and deliver the answers."""
        py_requests = [self._to_pb_request(r) for r in requests]
        result = self._run(self.model.execute(py_requests))
        if self.decoupled:
            if result is not None:
                for r in requests:
                    if not r.closed:
                        r.fail(
                            ErrorCode.INTERNAL,
                            "Python model '" + self.context.instance_name + "' is using the decoupled mode and "
                            "the execute function must return None.",
                        )
            return
        pending = [(r, p) for r, p in zip(requests, py_requests, strict=True) if not r.closed]
        if not pending:
            return  # every request was answered through its response sender
        if not isinstance(result, list | tuple):
            self._fail_all(requests, "Expected a list in the execute return")
            return
        if len(result) != len(requests):
            self._fail_all(
                requests,
                f"Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(result)}\n",
            )
            return
        for req, response in zip(requests, result, strict=True):
            if req.closed:
                continue
            if response is None:
                req.fail(ErrorCode.INTERNAL, "model returned None instead of an InferenceResponse")
            elif not isinstance(response, pb_utils.InferenceResponse):
                req.fail(
                    ErrorCode.INTERNAL,
                    f"Expected an InferenceResponse in the execute return, got {type(response).__name__}",
                )
            else:
                pb_utils._deliver(req, response, True)

    def _fail_all(self, requests: list[WorkerRequest], message: str) -> None:
        text = f"Failed to process the request(s) for model '{self.context.instance_name}', message: {message}"
        for r in requests:
            if not r.closed:
                r.fail(ErrorCode.INTERNAL, text)

    def _to_pb_request(self, r: WorkerRequest) -> pb_utils.InferenceRequest:
        inputs = [pb_utils._tensor_from_input(name, array) for name, array in r.inputs.items()]
        requested = r.requested_outputs or [o["name"] for o in self.context.config.get("output", [])]
        req = pb_utils.InferenceRequest(
            request_id=r.id,
            correlation_id=r.correlation_id,
            inputs=inputs,
            requested_output_names=requested,
            model_name=self.context.model_name,
            flags=r.flags,
            timeout=r.timeout_us,
            parameters=None,
        )
        req._parameters = r.parameters
        req._worker_request = r
        req._decoupled = self.decoupled
        return req

    def finalize(self) -> None:
        """Call the model's finalize()."""
        fin = getattr(self.model, "finalize", None)
        if fin is not None:
            self._run(fin())

    @classmethod
    def auto_complete(cls, config: dict[str, Any], model_dir: str, version_dir: str) -> dict[str, Any]:
        """Run TritonPythonModel.auto_complete_config, when the model defines it."""
        filename = config.get("default_model_filename") or "model.py"
        module = import_model_module(model_dir, version_dir, filename)
        hook = getattr(module.TritonPythonModel, "auto_complete_config", None)
        if hook is None:
            return config
        result = hook(pb_utils.ModelConfig(config))
        if not isinstance(result, pb_utils.ModelConfig):
            raise TypeError("auto_complete_config must return a pb_utils.ModelConfig")
        return result.as_dict()
