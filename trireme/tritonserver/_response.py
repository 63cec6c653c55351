"""tritonserver.InferenceResponse and the iterators a request's responses arrive through (sync and asyncio)."""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass, field
from typing import Any

from service.types import InferResponse
from trireme.tritonserver._errors import TritonError, from_service
from trireme.tritonserver._tensor import Tensor


@dataclass
class InferenceResponse:
    """One response: outputs by name as Tensors, or an error; `final` marks a request's last response."""

    model: Any  # the trireme.tritonserver.Model (not imported: it imports this module)
    request_id: str | None = None
    parameters: dict[str, str | int | bool] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)
    error: TritonError | None = None
    classification_label: str | None = None
    final: bool = False

    @staticmethod
    def _from_core(model: Any, response: InferResponse) -> InferenceResponse:
        outputs = {}
        for out in response.outputs:
            data = out.data
            if data is None:  # written into a client's shared-memory region: nothing to hand over here
                continue
            # an owned, writable copy: a view of a worker's arena must not outlive the worker (Server.stop())
            outputs[out.name] = Tensor._from_raw(out.datatype, out.shape, bytearray(data))
        return InferenceResponse(
            model=model,
            request_id=response.id,
            parameters=dict(response.parameters),  # type: ignore[arg-type]
            outputs=outputs,
            error=from_service(response.error) if response.error is not None else None,
            final=response.final,
        )


class _Iterator:
    """What both iterators share: the request to cancel, and how a response is judged."""

    def __init__(self, model: Any, cancel: Any, raise_on_error: bool) -> None:
        self._model = model
        self._cancel = cancel
        self._raise_on_error = raise_on_error
        self._complete = False

    def _take(self, response: InferenceResponse) -> InferenceResponse:
        if response.final:
            self._complete = True
        if response.error is not None and self._raise_on_error:
            raise response.error
        return response

    def cancel(self) -> None:
        """Ask the server to cancel the request (its remaining responses end with a CANCELLED error)."""
        if not self._complete:
            self._cancel()


class ResponseIterator(_Iterator):
    """Blocking iterator over a request's responses (`for response in model.infer(...)`)."""

    def __init__(self, model: Any, responses: queue.SimpleQueue, cancel: Any, raise_on_error: bool) -> None:
        super().__init__(model, cancel, raise_on_error)
        self._queue = responses

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        if self._complete:
            raise StopIteration
        return self._take(self._queue.get())


class AsyncResponseIterator(_Iterator):
    """asyncio iterator over a request's responses (`async for response in model.async_infer(...)`)."""

    def __init__(self, model: Any, responses: asyncio.Queue, cancel: Any, raise_on_error: bool) -> None:
        super().__init__(model, cancel, raise_on_error)
        self._queue = responses

    def __aiter__(self) -> AsyncResponseIterator:
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._complete:
            raise StopAsyncIteration
        return self._take(await self._queue.get())
