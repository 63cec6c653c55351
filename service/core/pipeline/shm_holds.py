"""Client shared memory held by requests: resolve a request's region references, keep the regions mapped until
the request's final response, check BYTES inputs that live in shm, and let workers drop unregistered regions."""

from __future__ import annotations

import logging
from typing import Any

from service.core.repository.repository import ModelRepository
from service.errors import ErrorCode, ServiceError
from service.types import InferRequest, InferResponse, ShmRef
from shm.errors import ShmError
from shm.tensor import element_count
from shm.views import bytes_extent

log = logging.getLogger("trireme.engine")
_REFS_MAX = 4096  # resolved references kept; past it the cache starts over


class ShmHolds:
    """The region references each request holds between `resolve` and its final response."""

    def __init__(self, registry: Any, repository: ModelRepository) -> None:
        self.registry = registry  # shm.registry.SharedMemoryRegistry, or None when client shm is disabled
        self.repository = repository
        self._holds: dict[InferRequest, list[Any]] = {}
        # (region_id, offset, byte_size) -> the resolved ShmRef, made once (a frozen ShmRef costs ~1 µs to build);
        # a region id names one registration and is never reused, so an entry can never be stale
        self._refs: dict[tuple[int, int, int], ShmRef] = {}
        if registry is not None:
            registry.on_retire = self._on_region_retired

    def __contains__(self, request: InferRequest) -> bool:
        return request in self._holds

    def resolve(self, request: InferRequest) -> bool:
        """Resolve every shm reference of `request` and hold its regions until the final response; whether it
        holds any.

        Holding (registry.acquire) keeps an unregistered region mapped until the request is done; the
        references are dropped by `release` (called from the response hook that `hold_until_final` installs,
        or directly when the request fails before it is enqueued).
        """
        held: list[Any] = []
        try:
            for t in request.inputs:
                if t.shm is not None and not t.shm.kind:
                    t.shm = self._resolve(t.shm, held)
            for o in request.outputs:
                if o.shm is not None and not o.shm.kind:
                    o.shm = self._resolve(o.shm, held)
        except BaseException:
            self._release(held)
            raise
        if held:
            self._holds[request] = held
            return True
        return False

    def _resolve(self, ref: ShmRef, held: list[Any]) -> ShmRef:
        registry = self.registry
        if registry is None:  # client shm disabled: no region can be registered
            raise ServiceError(ErrorCode.NOT_FOUND, f"Unable to find shared memory region: '{ref.region}'")
        try:
            r = registry.resolve(ref.region, ref.offset, ref.byte_size)
            registry.acquire(r)
        except ShmError as e:
            raise ServiceError(ErrorCode[e.code], e.message) from None
        held.append(r)
        refs = self._refs
        key = (r.region_id, r.offset, r.byte_size)
        resolved = refs.get(key)
        if resolved is None:
            if len(refs) >= _REFS_MAX:
                refs.clear()
            resolved = refs[key] = ShmRef(
                r.name, r.kind, r.key, r.offset, r.byte_size, r.device_id, r.raw_handle, r.path
            )
        return resolved

    def check_bytes(self, request: InferRequest) -> None:
        """BYTES inputs in system shm: every length prefix must fit and the elements must fill byte_size."""
        held = self._holds.get(request, ())
        for t in request.inputs:
            if t.shm is None or t.datatype != "BYTES" or t.shm.kind != "system":
                continue
            region = next(r for r in held if r.name == t.shm.region and r.offset == t.shm.offset)
            count = element_count(t.shape)
            try:
                extent = bytes_extent(self.registry.read(region), count)
            except ValueError as e:
                raise _bytes_error(request, t.name, str(e)) from None
            if extent != t.shm.byte_size:
                raise _bytes_error(
                    request, t.name, f"{count} elements use {extent} of the {t.shm.byte_size} bytes given"
                )

    def hold_until_final(self, request: InferRequest) -> None:
        """Wrap request.on_response so the request's shm regions are released on its final response."""
        if request not in self._holds:
            return
        deliver = request.on_response
        owner: InferRequest | None = request  # dropped on the final response: no request <-> closure cycle

        def on_response(response: InferResponse) -> None:
            nonlocal owner
            if response.final and owner is not None:
                self.release(owner)
                owner = None
            if deliver is not None:
                deliver(response)

        request.on_response = on_response

    def input_bytes(self, request: InferRequest, name: str) -> memoryview | None:
        """The bytes of an input held in a system shared-memory region (None for CUDA regions)."""
        t = next(t for t in request.inputs if t.name == name)
        assert t.shm is not None
        if t.shm.kind != "system":
            return None
        held = self._holds.get(request, ())
        region = next(r for r in held if r.name == t.shm.region and r.offset == t.shm.offset)
        return self.registry.read(region)

    def release(self, request: InferRequest) -> None:
        """Drop the shm region references `request` holds (idempotent)."""
        held = self._holds.pop(request, None)
        if held:
            self._release(held)

    def _release(self, held: list[Any]) -> None:
        for r in held:
            try:
                self.registry.release(r)
            except ShmError:
                log.exception("releasing shared memory region '%s'", r.name)

    def _on_region_retired(self, region: Any, last_user: bool) -> None:
        """A client region was unregistered and is no longer used: workers drop their own mappings of it."""
        if not last_user or region.kind != "system":
            return
        for entry in list(self.repository.models.values()):
            for mv in list(entry.versions.values()):
                pool = mv.pool
                for worker in list(pool.workers) if pool is not None else []:
                    worker.unmap_client_segments([region.key])


def _bytes_error(request: InferRequest, name: str, detail: str) -> ServiceError:
    return ServiceError(
        ErrorCode.INVALID_ARG,
        f"[request id: {request.id or '<id_unknown>'}] input '{name}' for model '{request.model_name}' has "
        f"malformed BYTES data in shared memory: {detail}",
    )
