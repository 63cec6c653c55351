"""The Python backend: runs an unmodified Triton `model.py` (class TritonPythonModel) inside the worker."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import logging
import os
import sys
import threading
import traceback
from collections.abc import Awaitable
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import Any

from service.errors import ErrorCode
from service.worker.backends.base import Backend, BackendContext, WorkerRequest
from service.worker.pb_utils import triton_python_backend_utils as pb_utils

PB_UTILS_NAME = "triton_python_backend_utils"
EXECUTOR_THREADS = 32  # the event loop's default executor (async_exec, run_in_executor), Triton's thread-pool-size

log = logging.getLogger("trireme.model")

_SEQUENCES = (list, tuple)  # what execute() may return (a tuple here, not `list | tuple` built per batch)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _run_forever(loop: asyncio.AbstractEventLoop, init: Any) -> None:
    if init is not None:
        init()
    loop.run_forever()


def _describe(e: BaseException) -> str:
    """'ExcType: message' as Triton reports a model's exception."""
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def import_model_module(model_dir: str, version_dir: str, filename: str, backend_dir: str = "") -> ModuleType:
    """Import <version_dir>/<filename> the way Triton does (model and version dirs on sys.path).

    With `backend_dir` (a Python-based backend, DIR/<name> of --backend-directory) the model's code is that
    folder's model.py, imported as module `model` with the folder on sys.path, as Triton's stub does.
    """
    sys.modules[PB_UTILS_NAME] = pb_utils
    pb_utils.runtime.model_dir = version_dir
    folder, entries = (backend_dir, (backend_dir,)) if backend_dir else (version_dir, (model_dir, version_dir))
    path = os.path.join(folder, "model.py" if backend_dir else filename)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"unable to find model file '{path}'")
    for entry in entries:
        if entry not in sys.path:
            sys.path.append(entry)
    name = "model" if backend_dir else f"{os.path.basename(version_dir)}.model"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "TritonPythonModel"):
        raise AttributeError(f"'{path}' does not define class TritonPythonModel")
    return module


def _ready_fn(model: Any) -> Any:
    """The model's readiness method: is_model_ready() (Triton's name), or is_ready(); None when it has neither."""
    for name in ("is_model_ready", "is_ready"):
        fn = getattr(model, name, None)
        if callable(fn):
            return fn
    return None


class PythonBackend(Backend):
    """Backend for `backend: "python"` models, and for models of a Python-based backend (`backend_dir` set)."""

    def __init__(self, context: BackendContext) -> None:
        super().__init__(context)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(context.config)
        self.model: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready_fn: Any = None
        # requested_output_names() of a request that names none: every output (listed once, copied per request)
        self._all_outputs = [o["name"] for o in context.config.get("output", [])]

    def initialize(self) -> None:
        """Import model.py, instantiate TritonPythonModel and call initialize(args)."""
        ctx = self.context
        pb_utils.runtime.bls = ctx.bls
        filename = ctx.config.get("default_model_filename") or "model.py"
        module = import_model_module(ctx.model_dir, ctx.version_dir, filename, self.backend_dir)
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
        self._ready_fn = _ready_fn(self.model)
        self.has_ready_fn = self._ready_fn is not None

    def is_ready(self) -> bool:
        """The model's optional is_model_ready() (or is_ready()), plain or async: ready only when it returns True;
        False, anything not a bool, or an exception mean not ready (as Triton's Python backend)."""
        if self._ready_fn is None:
            return True
        try:
            result = self._run(self._ready_fn())
        except Exception as e:
            log.error("model '%s' readiness check raised: %s", self.context.instance_name, _describe(e))
            return False
        if not isinstance(result, bool):
            log.error(
                "model '%s' readiness check returned %s, expected a bool: not ready",
                self.context.instance_name,
                type(result).__name__,
            )
            return False
        return result

    def _loop_running(self) -> asyncio.AbstractEventLoop:
        """The instance's event loop, running in a daemon thread (created on first use), as Triton's stub does."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            init = self.context.thread_init
            loop.set_default_executor(
                ThreadPoolExecutor(EXECUTOR_THREADS, thread_name_prefix="pb-async", initializer=init)
            )
            threading.Thread(target=_run_forever, args=(loop, init), name="pb-event-loop", daemon=True).start()
            self._loop = loop
        return self._loop

    def _run(self, result: Any) -> Any:
        """Await coroutines (async initialize/execute/finalize) on the instance's event loop."""
        if not inspect.isawaitable(result):
            return result
        return asyncio.run_coroutine_threadsafe(_awaited(result), self._loop_running()).result()

    def execute(self, requests: list[WorkerRequest]) -> None:
        """Hand the batch to model.execute as a list of pb_utils.InferenceRequest and deliver the answers."""
        py_requests = []
        for r in requests:  # plain loops, not comprehensions: one function object less each, per batch
            py_requests.append(self._to_pb_request(r))
        result = self.model.execute(py_requests)
        if self.decoupled and inspect.iscoroutine(result):
            # decoupled async execute runs in the background: the next batch may start while this one awaits
            future = asyncio.run_coroutine_threadsafe(result, self._loop_running())
            future.add_done_callback(lambda f: self._background_done(f, requests, py_requests))
            return
        if type(result) is not list:  # a list (the usual answer) is never awaitable: skip the ABC check
            result = self._run(result)
        if self.decoupled:
            if result is not None:
                self._fail_all(
                    requests,
                    f"Python model '{self.context.instance_name}' is using the decoupled mode and the execute "
                    "function must return None.",
                )
            else:
                _reschedule_released(requests, py_requests)
            return
        if result is None:  # answered (now or later) through the response senders
            for r in requests:
                r.deferred = True
            return
        if not isinstance(result, _SEQUENCES):
            self._fail_all(requests, f"Expected a list in the execute return, found type '{type(result)}'.")
            return
        if len(result) != len(requests):
            self._fail_all(
                requests,
                f"Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(result)}\n",
            )
            return
        for i in range(len(requests)):  # lengths checked above (zip(strict=True) parses a keyword per batch)
            req, py_req, response = requests[i], py_requests[i], result[i]
            rescheduled = py_req._release_flags & pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
            if response is None:
                if rescheduled and not req.closed:
                    req.reschedule()
                else:
                    req.deferred = True  # may still come through the response sender
                continue
            if rescheduled:
                self._fail_all(
                    [req],
                    "Expected a None object in the execute function return list for reschduled request, found "
                    f"type '{type(response)}'.",
                )
                continue
            if not isinstance(response, pb_utils.InferenceResponse):
                self._fail_all(
                    [req],
                    "Expected an 'InferenceResponse' object in the execute function return list, found type "
                    f"'{type(response)}'.",
                )
                continue
            if py_req._sender is not None:
                try:
                    py_req._sender._take_returned(response)
                except pb_utils.TritonModelException as e:  # already answered through the sender
                    log.error(self._failure(str(e)))
                    continue
            if not req.closed:
                pb_utils._deliver(req, response, True)

    def _background_done(
        self, future: Future[Any], requests: list[WorkerRequest], py_requests: list[pb_utils.InferenceRequest]
    ) -> None:
        """A decoupled async execute finished: log its exception (as Triton does) and fail what it left open."""
        error = future.exception()
        if error is None:
            _reschedule_released(requests, py_requests)
            return
        log.error("%s", "".join(traceback.TracebackException.from_exception(error).format()))
        self._fail_all(requests, _describe(error))

    def _failure(self, message: str) -> str:
        return f"Failed to process the request(s) for model '{self.context.instance_name}', message: {message}"

    def _fail_all(self, requests: list[WorkerRequest], message: str) -> None:
        text = self._failure(message)
        log.error("%s", text)
        for r in requests:
            if not r.closed:
                with contextlib.suppress(RuntimeError):  # a sender on another thread may close it first
                    r.fail(ErrorCode.INTERNAL, text)

    def _to_pb_request(self, r: WorkerRequest) -> pb_utils.InferenceRequest:
        inputs = []
        new_tensor = pb_utils._tensor_from_input
        for name, array in r.inputs.items():
            inputs.append(new_tensor(name, array))
        names = r.requested_outputs
        requested = list(names) if names else list(self._all_outputs)
        return pb_utils._incoming(
            r.id,
            r.correlation_id,
            inputs,
            requested,
            self.context.model_name,
            r.flags,
            r.timeout_us,
            r.extra.get("trace_id", 0),
            r.parameters,
            r,
            self.decoupled,
        )

    def finalize(self) -> None:
        """Call the model's finalize()."""
        fin = getattr(self.model, "finalize", None)
        if fin is not None:
            self._run(fin())
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    @classmethod
    def auto_complete(cls, config: dict[str, Any], model_dir: str, version_dir: str) -> dict[str, Any]:
        """Run TritonPythonModel.auto_complete_config, when the model defines it."""
        filename = config.get("default_model_filename") or "model.py"
        module = import_model_module(model_dir, version_dir, filename, cls.backend_dir)
        hook = getattr(module.TritonPythonModel, "auto_complete_config", None)
        if hook is None:
            return config
        result = hook(pb_utils.ModelConfig(config))
        if not isinstance(result, pb_utils.ModelConfig):
            raise TypeError("auto_complete_config must return a pb_utils.ModelConfig")
        return result.as_dict()


def _reschedule_released(requests: list[WorkerRequest], py_requests: list[pb_utils.InferenceRequest]) -> None:
    """A decoupled model's requests that it released for rescheduling before execute returned, and left open."""
    for req, py_req in zip(requests, py_requests, strict=True):
        if py_req._release_flags & pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE and not req.closed:
            with contextlib.suppress(RuntimeError):  # its sender closed it meanwhile
                req.reschedule()
