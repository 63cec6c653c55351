"""Puts the response cache in front of a model's scheduler: hits answer at once, misses fill the cache.

Statistics follow Triton: a hit counts as a successful request (and in `queue`, with the time until the
lookup) and in `cache_hit` with the lookup time, never in `inference_count`/`execution_count`/compute; a miss
counts in `cache_miss` with the lookup time plus, once the response is stored, the insertion time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from service.core.pipeline.response_cache import CacheStore, request_key
from service.core.repository.repository import ModelVersion
from service.types import InferRequest, InferResponse, OutputTensor, ResponseCallback

ShmReader = Callable[[InferRequest, str], memoryview | None]


class CacheGate:
    """Looks requests up in the cache and wraps the response path of misses to store their result."""

    def __init__(self, cache: CacheStore, read_shm: ShmReader) -> None:
        self.cache = cache
        self._read_shm = read_shm

    @staticmethod
    def applies_to(mv: ModelVersion) -> bool:
        """Caching is on for this model: asked for in its config, and neither decoupled nor a sequence model."""
        config = mv.config
        return config.response_cache.enable and not mv.decoupled and not config.HasField("sequence_batching")

    def lookup(self, mv: ModelVersion, request: InferRequest) -> tuple[InferResponse | None, bytes | None]:
        """(the cached response, None) on a hit; (None, key) on a miss; (None, None) when not cacheable."""
        start = time.monotonic_ns()
        key = request_key(request, self._read_shm, frozenset(o.name for o in mv.config.output))
        if key is None:
            return None, None
        entry = self.cache.lookup(key)
        end = time.monotonic_ns()
        stats = mv.stats
        if entry is None:
            stats.cache_miss.add(end - start)
            return None, key
        stats.cache_hit.add(end - start)
        stats.queue.add(max(0, start - request.arrival_ns))
        stats.record_end(True, end - request.arrival_ns)
        stats.last_inference_ms = time.time_ns() // 1_000_000
        outputs = [OutputTensor(o.name, o.datatype, list(o.shape), o.data) for o in entry.outputs]
        response = InferResponse(request.model_name, request.model_version, request.id, outputs, dict(entry.parameters))
        return response, None

    def storing(self, mv: ModelVersion, key: bytes, deliver: ResponseCallback) -> ResponseCallback:
        """Wrap `deliver` so that a request's single successful response is stored under `key` first."""
        cache = self.cache
        stats = mv.stats
        streamed = False

        def on_response(response: InferResponse) -> None:
            nonlocal streamed
            if not response.final:
                streamed = True  # several responses (a decoupled step in an ensemble): nothing to store
            elif (
                not streamed
                and response.error is None
                and not response.null
                and all(o.data is not None for o in response.outputs)
            ):
                start = time.monotonic_ns()
                cache.insert(key, response.outputs, response.parameters)
                stats.cache_miss.ns += time.monotonic_ns() - start
            deliver(response)

        return on_response
