"""The local response cache: results of earlier identical requests, kept in LRU order within a byte budget.

A request is identified as Triton identifies it: model name, model version and every input's name, datatype,
shape and bytes (shared-memory inputs are read at request time), plus which outputs were asked for (so a
response never lacks an output the client requested). Keys are 128-bit xxh3 digests.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import xxhash

from service.types import InferRequest, OutputTensor, ParamValue

# What an entry costs beyond its tensor bytes (key, shapes, names, bookkeeping): keeps many tiny entries honest.
ENTRY_OVERHEAD_BYTES = 128
_SEP = b"\x00"


@dataclass(slots=True, frozen=True)
class CachedResponse:
    """What a hit hands back: immutable output bytes and the response parameters."""

    outputs: tuple[OutputTensor, ...]
    parameters: tuple[tuple[str, ParamValue], ...]
    nbytes: int


@dataclass(slots=True)
class CacheCounters:
    """Server-wide cache activity (Triton's nv_cache_* server metrics)."""

    lookups: int = 0
    hits: int = 0
    misses: int = 0
    inserts: int = 0
    evictions: int = 0
    skipped_oversize: int = 0
    failures: int = 0  # Redis operations that failed (the request was served as a miss)


def request_key(
    request: InferRequest,
    read_shm: Callable[[InferRequest, str], memoryview | None],
    model_outputs: frozenset[str] = frozenset(),
) -> bytes | None:
    """The cache key of a prepared request, or None when it cannot be cached.

    `read_shm(request, input_name)` returns the bytes of an input held in system shared memory (None when they
    are not host memory, e.g. a CUDA region). Outputs written into client shared memory are never cached.
    Asking for every one of `model_outputs` by name is the same request as asking for none (all outputs).
    """
    if any(o.shm is not None for o in request.outputs):
        return None
    h = xxhash.xxh3_128()
    h.update(request.model_name.encode())
    h.update(_SEP)
    h.update(request.model_version.encode())
    for t in sorted(request.inputs, key=lambda t: t.name):
        h.update(_SEP)
        h.update(t.name.encode())
        h.update(_SEP)
        h.update(t.datatype.encode())
        h.update(repr(t.shape).encode())
        data: bytes | memoryview | None = read_shm(request, t.name) if t.shm is not None else t.data or b""
        if data is None:
            return None
        view = memoryview(data)
        h.update(view.nbytes.to_bytes(8, "little"))
        h.update(view)
    requested = request.outputs
    if (
        model_outputs
        and len(requested) == len(model_outputs)
        and not any(o.classification for o in requested)
        and {o.name for o in requested} == model_outputs
    ):
        requested = []
    for o in sorted(requested, key=lambda o: o.name):
        h.update(f"\x01{o.name}:{o.classification}".encode())
    return h.digest()


class CacheStore(Protocol):
    """What the cache gate needs of a cache: the local one below, or the Redis one (redis_cache.py)."""

    counters: CacheCounters

    def lookup(self, key: bytes) -> CachedResponse | None:
        """The cached response for `key`, or None."""

    def insert(self, key: bytes, outputs: list[OutputTensor], parameters: dict[str, ParamValue]) -> bool:
        """Store a response under `key`; False when it was not stored."""


class ResponseCache:
    """LRU map from request keys to responses, never holding more than `budget_bytes` (thread safe)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self.counters = CacheCounters()
        self._entries: OrderedDict[bytes, CachedResponse] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: bytes) -> CachedResponse | None:
        """The cached response for `key` (now the most recently used), or None."""
        with self._lock:
            self.counters.lookups += 1
            entry = self._entries.get(key)
            if entry is None:
                self.counters.misses += 1
                return None
            self._entries.move_to_end(key)
            self.counters.hits += 1
            return entry

    def insert(self, key: bytes, outputs: list[OutputTensor], parameters: dict[str, ParamValue]) -> bool:
        """Store a copy of a response; False when it is larger than the whole budget (never stored)."""
        nbytes = ENTRY_OVERHEAD_BYTES + len(key)
        for o in outputs:
            nbytes += len(o.data) if o.data is not None else 0
        if nbytes > self.budget_bytes:
            with self._lock:
                self.counters.skipped_oversize += 1
            return False
        copied = tuple(
            OutputTensor(o.name, o.datatype, list(o.shape), bytes(o.data) if o.data is not None else b"")
            for o in outputs
        )
        entry = CachedResponse(copied, tuple(parameters.items()), nbytes)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.used_bytes -= old.nbytes
            while self._entries and self.used_bytes + nbytes > self.budget_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.used_bytes -= evicted.nbytes
                self.counters.evictions += 1
            self._entries[key] = entry
            self.used_bytes += nbytes
            self.counters.inserts += 1
        return True

    def utilization(self) -> float:
        """Fraction of the budget in use (0..1)."""
        return self.used_bytes / self.budget_bytes if self.budget_bytes else 0.0
