"""tritonserver.Model: a model of a started server: inference (sync and asyncio iterators), metadata, config,
readiness, statistics."""

from __future__ import annotations

import asyncio
import queue
from typing import Any

from service.core.repository.model_config import to_json_dict
from service.errors import ServiceError
from service.frontend.http.admin import stats_json
from service.types import InferResponse
from trireme._core.runtime import CoreRuntime
from trireme.tritonserver._enums import ModelBatchFlag, ModelTxnPropertyFlag
from trireme.tritonserver._errors import InvalidArgumentError, from_service
from trireme.tritonserver._request import InferenceRequest
from trireme.tritonserver._response import AsyncResponseIterator, InferenceResponse, ResponseIterator


class Model:
    """A model of a started server (validated when used, as in Triton)."""

    def __init__(
        self, server: Any, name: str, version: int = -1, state: str | None = None, reason: str | None = None
    ) -> None:
        self._runtime: CoreRuntime = server._running()
        self.name = name
        self.version = version
        self.state = state
        self.reason = reason

    def _version(self) -> str:
        return "" if self.version < 0 else str(self.version)

    def _ask(self, fn: Any) -> Any:
        """Call fn() on the server's loop; core errors become tritonserver errors."""
        try:
            return self._runtime.call(fn)
        except ServiceError as e:
            raise from_service(e) from None

    def create_request(self, **kwargs: Any) -> InferenceRequest:
        """A request for this model (InferenceRequest's fields as keywords)."""
        kwargs.pop("model", None)
        return InferenceRequest(model=self, **kwargs)

    def _start(self, request: InferenceRequest, deliver: Any) -> Any:
        """Submit `request`; every response goes to deliver(InferenceResponse) from the server's loop. Returns
        the function that cancels it."""
        if request.model is not self:
            request.model = self
        try:
            core_request = request._to_core()
        except ServiceError as e:
            raise from_service(e) from None

        def on_response(response: InferResponse) -> None:
            deliver(InferenceResponse._from_core(self, response))

        runtime = self._runtime
        mv = self._ask(lambda: runtime.engine.submit(core_request, on_response))

        def cancel() -> None:
            runtime.thread.loop.call_soon_threadsafe(runtime.engine.cancel, core_request, mv)

        return cancel

    def infer(
        self, inference_request: InferenceRequest | None = None, raise_on_error: bool = True, **kwargs: Any
    ) -> ResponseIterator:
        """Send a request; its responses (one, or a decoupled model's many) through a blocking iterator."""
        if inference_request is None:
            inference_request = InferenceRequest(model=self, **kwargs)
        responses = inference_request.response_queue
        if not isinstance(responses, queue.SimpleQueue):
            responses = queue.SimpleQueue()
        cancel = self._start(inference_request, responses.put)
        return ResponseIterator(self, responses, cancel, raise_on_error)

    def async_infer(
        self, inference_request: InferenceRequest | None = None, raise_on_error: bool = True, **kwargs: Any
    ) -> AsyncResponseIterator:
        """Send a request from a coroutine; its responses through an asyncio iterator on the caller's loop."""
        if inference_request is None:
            inference_request = InferenceRequest(model=self, **kwargs)
        loop = asyncio.get_running_loop()
        responses = inference_request.response_queue
        if not isinstance(responses, asyncio.Queue):
            responses = asyncio.Queue()
        put = responses.put_nowait
        cancel = self._start(inference_request, lambda r: loop.call_soon_threadsafe(put, r))
        return AsyncResponseIterator(self, responses, cancel, raise_on_error)

    def metadata(self) -> dict[str, Any]:
        """Name, versions, platform, inputs and outputs (datatype and shape)."""
        meta = self._ask(lambda: self._runtime.engine.model_metadata(self.name, self._version()))

        def tensors(items: list[Any]) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]

        return {
            "name": meta.name,
            "versions": list(meta.versions),
            "platform": meta.platform,
            "inputs": tensors(meta.inputs),
            "outputs": tensors(meta.outputs),
        }

    def ready(self) -> bool:
        """Whether the model (this version, or any) is ready for requests."""
        try:
            return bool(self._runtime.run(self._runtime.engine.model_ready(self.name, self._version())))
        except ServiceError as e:
            raise from_service(e) from None

    def batch_properties(self) -> ModelBatchFlag:
        config = self._ask(lambda: self._runtime.engine.model_config(self.name, self._version()))
        return ModelBatchFlag.FIRST_DIM if config.max_batch_size > 0 else ModelBatchFlag.UNKNOWN

    def transaction_properties(self) -> ModelTxnPropertyFlag:
        decoupled = self._ask(lambda: self._runtime.engine.repository.get(self.name, self._version()).decoupled)
        return ModelTxnPropertyFlag.DECOUPLED if decoupled else ModelTxnPropertyFlag.ONE_TO_ONE

    def statistics(self) -> dict[str, Any]:
        """Statistics of the model's ready versions, as Triton's statistics extension reports them."""
        rows = self._ask(lambda: self._runtime.engine.statistics(self.name, self._version()))
        return {"model_stats": [stats_json(name, version, stats) for name, version, stats in rows]}

    def config(self, config_version: int = 1) -> dict[str, Any]:
        """The model's (completed) configuration as a dictionary."""
        if config_version != 1:
            raise InvalidArgumentError(f"model configuration version {config_version} not supported")
        config = self._ask(lambda: self._runtime.engine.model_config(self.name, self._version()))
        return to_json_dict(config)

    def __repr__(self) -> str:
        return str({"name": self.name, "version": self.version, "state": self.state})

    __str__ = __repr__
