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


def incompatible_arguments(call: str, signature: str, args: tuple[object, ...]) -> TypeError:
    """The TypeError Triton's pybind11-bound pb_utils raise for an argument of the wrong type (None included):
    `call` is e.g. "__init__()" or "log()", `signature` the accepted form."""
    kind = "constructor" if call == "__init__()" else "function"
    invoked = ", ".join(repr(a) for a in args)
    return TypeError(
        f"{call}: incompatible {kind} arguments. The following argument types are supported:\n"
        f"    1. {signature}\n\nInvoked with: {invoked}"
    )
