"""The one transport-neutral error type of the core, with Triton's error codes."""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Triton's TRITONSERVER_Error codes (same ordinals as pb_utils.TritonError)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class ServiceError(Exception):
    """An error with a Triton code; frontends map the code to a gRPC or HTTP status in one table."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"ServiceError({self.code.name}, {self.message!r})"


def invalid_arg(message: str) -> ServiceError:
    """Shorthand for the most common request error."""
    return ServiceError(ErrorCode.INVALID_ARG, message)
