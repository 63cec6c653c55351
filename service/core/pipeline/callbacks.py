"""Response-callback wrappers the engine puts around a request's on_response: tracing, admission accounting and
classification. Each takes the callback it wraps and returns the one to use instead."""

from __future__ import annotations

from service.core.observability import trace_hooks
from service.core.pipeline.admission import Admission
from service.core.pipeline.classification import classify, load_labels
from service.core.repository.repository import ModelVersion
from service.errors import ErrorCode, ServiceError
from service.types import InferRequest, InferResponse, ResponseCallback


def traced(request: InferRequest, mv: ModelVersion, deliver: ResponseCallback) -> ResponseCallback:
    """QUEUE_START (and the input tensors) now; REQUEST_END and output tensors as responses arrive."""
    trace_hooks.queued(request.trace, request, mv.version)
    return trace_hooks.answering(request.trace, deliver)


def admitted(admission: Admission, mv: ModelVersion, deliver: ResponseCallback) -> ResponseCallback:
    """Wrap a response callback so the request leaves the admission count on its final response."""
    done = False

    def on_response(response: InferResponse) -> None:
        nonlocal done
        if response.final and not done:
            done = True
            admission.leave(mv)
        deliver(response)

    return on_response


class Classifier:
    """Turns outputs requested with `classification` into top-k strings; label files are read once."""

    def __init__(self) -> None:
        self._labels: dict[tuple[str, str], list[str]] = {}  # (model dir, label file) -> labels

    def wrap(self, mv: ModelVersion, request: InferRequest, deliver: ResponseCallback) -> ResponseCallback:
        """Wrap a response callback so outputs requested with `classification` become top-k strings."""
        wanted = {o.name: o.classification for o in request.outputs if o.classification}
        labels = {}
        for t in mv.config.output:
            if t.name in wanted:
                key = (mv.model_dir, t.label_filename)
                if key not in self._labels:
                    self._labels[key] = load_labels(*key)
                labels[t.name] = self._labels[key]
        batched = mv.config.max_batch_size > 0

        def on_response(response: InferResponse) -> None:
            if response.error is None and response.outputs:
                try:
                    response.outputs = [
                        classify(o, wanted[o.name], labels[o.name], batched) if o.name in wanted else o
                        for o in response.outputs
                    ]
                except ValueError as e:
                    response.outputs = []
                    response.error = ServiceError(ErrorCode.INVALID_ARG, str(e))
            deliver(response)

        return on_response
