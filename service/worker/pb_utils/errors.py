"""pb_utils.TritonError (an error a response carries) and pb_utils.TritonModelException."""

from __future__ import annotations


class TritonError:
    """An error a model attaches to a response; its code reaches the client as gRPC/HTTP status."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        """The error text."""
        return self._message

    def code(self) -> int:
        """The TritonError code."""
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"


class TritonModelException(Exception):
    """Raised by pb_utils calls that fail; a model may raise it too."""
