"""What a bound function receives: one Request per inference request, a read-only mapping of input name to
numpy array, with the request's parameters (PyTriton's Request)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np


class Request(Mapping[str, np.ndarray]):
    """The inputs of one request by name, plus `parameters` and `requested_output_names`."""

    __slots__ = ("data", "parameters", "requested_output_names")

    def __init__(
        self, data: dict[str, np.ndarray], parameters: dict[str, Any] | None = None, requested: list[str] | None = None
    ) -> None:
        self.data = data
        self.parameters = parameters or {}
        self.requested_output_names = requested or []

    def __getitem__(self, name: str) -> np.ndarray:
        return self.data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"Request({self.data!r}, parameters={self.parameters!r})"


def batch_size(request: Mapping[str, np.ndarray]) -> int:
    """A request's batch size: the first dimension of its first input (PyTriton's rule)."""
    for array in request.values():
        return int(array.shape[0]) if array.ndim else 1
    return 0
