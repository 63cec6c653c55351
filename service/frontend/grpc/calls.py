"""What --grpc-header-forward-pattern asks of ModelInfer and ModelStreamInfer calls: request headers forwarded as
request parameters. Off (None) unless the flag is given, so the common call pays nothing. (Response compression,
--grpc-infer-response-compression-level, is a server option: `compression_option`.)"""

from __future__ import annotations

import re
from typing import Any

from service.config.access import GrpcSettings
from service.errors import ErrorCode, ServiceError
from service.frontend.grpc.observers import InferObserver
from service.types import InferRequest

# Triton's reserved parameter keys (src/common.h); forwarded headers must not set them, nor any 'triton_' key
RESERVED_KEYS = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output")
)
# Triton's levels as grpc core numbers them (grpc_compression_level); core picks the algorithm the client accepts
_LEVEL = {"none": 0, "low": 1, "medium": 2, "high": 3}


def compression_option(level: str) -> list[tuple[str, int]]:
    """The server option of --grpc-infer-response-compression-level. grpc.aio's per-call set_compression does not
    compress (measured), so the level is the server's default for every response it sends, Triton's infer
    responses included; none adds nothing."""
    value = _LEVEL.get(level, 0)
    return [("grpc.default_compression_level", value)] if value else []


class CallOptions:
    """What the flags ask of each inference call."""

    __slots__ = ("forward",)

    def __init__(self, forward: str) -> None:
        # matched as Triton's RE2::PartialMatch: anywhere in the (lower-case) metadata key
        self.forward = re.compile(forward) if forward else None

    @staticmethod
    def of(settings: GrpcSettings) -> CallOptions | None:
        """The options of these settings; None when the flag is not set."""
        return CallOptions(settings.header_forward_pattern) if settings.header_forward_pattern else None

    def observer(self, context: Any) -> InferObserver:
        return CallObserver(self, context)

    def forward_headers(self, context: Any, request: InferRequest) -> None:
        """Matching metadata as string parameters; INVALID_ARG (Triton's message) for a reserved key."""
        if self.forward is None:
            return
        for key, value in context.invocation_metadata() or ():
            if not self.forward.search(key):
                continue
            if key in RESERVED_KEYS or key.startswith("triton_"):
                raise ServiceError(
                    ErrorCode.INVALID_ARG, f"Header '{key}' is reserved for Triton usage and cannot be forwarded."
                )
            request.parameters[key] = value if isinstance(value, str) else bytes(value).decode(errors="replace")


class CallObserver(InferObserver):
    """ModelInfer's view of CallOptions: headers become parameters once the request is decoded."""

    __slots__ = ("context", "options")

    def __init__(self, options: CallOptions, context: Any) -> None:
        self.options = options
        self.context = context

    def decoded(self, request: InferRequest) -> None:
        self.options.forward_headers(self.context, request)
