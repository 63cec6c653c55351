"""Triton's exception classes (tritonserver.TritonError and its subclasses) and the mapping from the core's."""

from __future__ import annotations

from service.errors import ErrorCode, ServiceError


class TritonError(Exception):
    """Base of every error the in-process API raises (a Triton error code and its message)."""

    __module__ = "tritonserver"


class UnknownError(TritonError):
    __module__ = "tritonserver"


class InternalError(TritonError):
    __module__ = "tritonserver"


class NotFoundError(TritonError):
    __module__ = "tritonserver"


class InvalidArgumentError(TritonError):
    __module__ = "tritonserver"


class UnavailableError(TritonError):
    __module__ = "tritonserver"


class UnsupportedError(TritonError):
    __module__ = "tritonserver"


class AlreadyExistsError(TritonError):
    __module__ = "tritonserver"


class CancelledError(TritonError):
    __module__ = "tritonserver"


_BY_CODE: dict[ErrorCode, type[TritonError]] = {
    ErrorCode.UNKNOWN: UnknownError,
    ErrorCode.INTERNAL: InternalError,
    ErrorCode.NOT_FOUND: NotFoundError,
    ErrorCode.INVALID_ARG: InvalidArgumentError,
    ErrorCode.UNAVAILABLE: UnavailableError,
    ErrorCode.UNSUPPORTED: UnsupportedError,
    ErrorCode.ALREADY_EXISTS: AlreadyExistsError,
    ErrorCode.CANCELLED: CancelledError,
}


def from_service(error: ServiceError) -> TritonError:
    """The tritonserver exception for a core error (same message)."""
    return _BY_CODE.get(error.code, UnknownError)(error.message)
