"""The one error type of the shm package: a Triton-style code plus the message clients see."""

from __future__ import annotations

from typing import Literal

ShmCode = Literal["NOT_FOUND", "INVALID_ARG", "ALREADY_EXISTS", "INTERNAL", "UNAVAILABLE", "UNSUPPORTED"]


class ShmError(Exception):
    """A shared-memory failure with a Triton error code; the server maps `code` onto its own error type."""

    def __init__(self, code: ShmCode, message: str) -> None:
        super().__init__(message)
        self.code: ShmCode = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"ShmError({self.code!r}, {self.message!r})"

    def __reduce__(self) -> tuple[type[ShmError], tuple[ShmCode, str]]:
        return (type(self), (self.code, self.message))
