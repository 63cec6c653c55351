"""Method handlers of the gRPC services, built once at start: unparsable bodies and restricted API groups are
answered before the servicer runs, with no per-call cost for methods that are not restricted."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from protos import grpc_service_pb2 as pb
from protos import health_pb2
from service.config.access import RestrictedApi
from service.frontend.grpc import large as grpc_large
from service.frontend.grpc import wire as grpc_wire
from service.frontend.grpc.codec import UNPARSABLE

log = logging.getLogger("trireme.grpc")
_F = TypeVar("_F", bound=Callable[..., Any])

INFERENCE_SERVICE = "inference.GRPCInferenceService"
HEALTH_SERVICE = "grpc.health.v1.Health"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
UNPARSABLE_MESSAGE = "Unable to parse request"

# Triton's API groups: the RPCs each one covers (grpc.health.v1 Check belongs to "health", as in Triton)
API_GROUPS: dict[str, tuple[str, ...]] = {
    "health": ("ServerLive", "ServerReady", "ModelReady", f"{HEALTH_SERVICE}/Check"),
    "metadata": ("ServerMetadata", "ModelMetadata"),
    "inference": ("ModelInfer", "ModelStreamInfer"),
    "shared-memory": (
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister",
    ),
    "model-config": ("ModelConfig",),
    "model-repository": ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"),
    "statistics": ("ModelStatistics",),
    "trace": ("TraceSetting",),
    "logging": ("LogSettings",),
}


class RateLimitedLog:
    """One warning line per `interval_s` for a recurring event, with the count of the ones not logged."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._next = 0.0
        self._suppressed = 0

    def warning(self, message: str, *args: Any) -> None:
        """Log now, or count it when a line was logged less than interval_s ago."""
        now = time.monotonic()
        if now < self._next:
            self._suppressed += 1
            return
        self._next = now + self.interval_s
        if self._suppressed:
            message += f" ({self._suppressed} more since the last report)"
            self._suppressed = 0
        self.logger.warning(message, *args)


def _deserializer(
    parse: Callable[[bytes], Any], small: Callable[[bytes], Any] | None = None, small_bytes: int = 0
) -> Callable[[bytes], Any]:
    """The message class's parser, answering UNPARSABLE instead of raising (grpc would log a traceback).

    With `small`, bodies up to `small_bytes` go straight to it (ModelInfer: protobuf's own parser for every
    message but the large ones `parse` splits), one Python-level call less per request."""

    if small is None:

        def deserialize(raw: bytes) -> Any:
            try:
                return parse(raw)
            except (DecodeError, RuntimeError, ValueError):
                return UNPARSABLE

    else:
        fast = small

        def deserialize(raw: bytes) -> Any:
            try:
                return fast(raw) if len(raw) <= small_bytes else parse(raw)
            except (DecodeError, RuntimeError, ValueError):
                return UNPARSABLE

    return deserialize


class HandlerFactory:
    """Wraps servicer methods with the checks configured for the server."""

    def __init__(self, restricted: list[RestrictedApi]) -> None:
        self.unparsable_log = RateLimitedLog(log)
        self.rules: dict[str, tuple[str, str]] = {}  # method key -> (header, expected value)
        for rule in restricted:
            for group in rule.groups:
                for method in API_GROUPS[group]:
                    self.rules[method] = (GRPC_HEADER_PREFIX + rule.key, rule.value)

    def _rule(self, key: str) -> tuple[str, str] | None:
        return self.rules.get(key)

    def unary(
        self,
        key: str,
        behavior: Callable[..., Any],
        parse: Callable[[bytes], Any],
        serialize: Any,
        deserialize: Callable[[bytes], Any] | None = None,
    ) -> Any:
        """A unary-unary handler for `behavior` (method key as in API_GROUPS); `deserialize` replaces
        _deserializer(parse) when given."""
        rule = self._rule(key)
        reject = self.reject_unparsable

        if rule is None and getattr(behavior, "checks_unparsable", False):
            handler = behavior  # it answers UNPARSABLE itself: no wrapping coroutine per call
        elif rule is None:

            async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if request is UNPARSABLE:
                    await reject(context)
                return await behavior(request, context)

        else:
            header, value = rule

            async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await _check_header(context, header, value)
                if request is UNPARSABLE:
                    await reject(context)
                return await behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(
            handler, request_deserializer=deserialize or _deserializer(parse), response_serializer=serialize
        )

    def stream(self, key: str, behavior: Callable[..., Any], parse: Callable[[bytes], Any], serialize: Any) -> Any:
        """A stream-stream handler; each unparsable message reaches the behavior as grpc_codec.UNPARSABLE."""
        rule = self._rule(key)
        if rule is None:
            handler = behavior
        else:
            header, value = rule

            async def handler(request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
                await _check_header(context, header, value)
                await behavior(request_iterator, context)

        return grpc.stream_stream_rpc_method_handler(
            handler, request_deserializer=_deserializer(parse), response_serializer=serialize
        )

    async def reject_unparsable(self, context: grpc.aio.ServicerContext) -> None:
        """Abort a call whose request body is not valid protobuf (INVALID_ARGUMENT), with a rate-limited log."""
        self.note_unparsable(context)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, UNPARSABLE_MESSAGE)

    def note_unparsable(self, context: grpc.aio.ServicerContext) -> None:
        """One rate-limited log line for a request body that is not valid protobuf."""
        self.unparsable_log.warning("rejected a request that is not valid protobuf from %s", context.peer())


def checks_unparsable(behavior: _F) -> _F:
    """Mark a unary servicer method that starts with `if request is UNPARSABLE: await reject_unparsable(...)`
    itself: HandlerFactory then registers it as it is, without a wrapping coroutine (the hot ModelInfer)."""
    behavior.checks_unparsable = True  # type: ignore[attr-defined]
    return behavior


async def _check_header(context: grpc.aio.ServicerContext, header: str, value: str) -> None:
    for k, v in context.invocation_metadata() or ():
        if k == header and v == value:
            return
    await context.abort(grpc.StatusCode.UNAVAILABLE, f"This protocol is restricted, expecting header '{header}'")


def inference_handlers(servicer: Any, factory: HandlerFactory) -> dict[str, Any]:
    """Every RPC of inference.GRPCInferenceService, from the service descriptor and the servicer's methods."""
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        request_cls = getattr(pb, method.input_type.name)
        response_cls = getattr(pb, method.output_type.name)
        behavior = getattr(servicer, method.name)
        make = factory.stream if method.client_streaming else factory.unary
        if method.name == "ModelInfer":  # large messages are split / serialised without protobuf copies
            parse = _deserializer(grpc_large.parse_request, grpc_wire.parse_small_request, grpc_large.LARGE_BYTES)
            handlers[method.name] = factory.unary(
                method.name, behavior, grpc_large.parse_request, grpc_large.serialize, parse
            )
            continue
        handlers[method.name] = make(method.name, behavior, request_cls.FromString, response_cls.SerializeToString)
    return handlers


def health_handlers(servicer: Any, factory: HandlerFactory) -> dict[str, Any]:
    """grpc.health.v1.Health/Check."""
    check = factory.unary(
        f"{HEALTH_SERVICE}/Check",
        servicer.Check,
        health_pb2.HealthCheckRequest.FromString,
        health_pb2.HealthCheckResponse.SerializeToString,
    )
    return {"Check": check}
