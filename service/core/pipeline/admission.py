"""Admission limits: how many inference requests may be in flight in the whole server and in each model version."""

from __future__ import annotations

from typing import Any

from service.errors import ErrorCode, ServiceError


class Admission:
    """Counts requests from enqueue to final response; refuses new ones with UNAVAILABLE above a bound.

    `server_limit` bounds the whole server, `model_limit` each model version; 0 means no bound. Both front ends
    reach it through the Engine, so HTTP and gRPC requests share the bounds.
    """

    def __init__(self, server_limit: int = 0, model_limit: int = 0) -> None:
        self.server_limit = server_limit
        self.model_limit = model_limit
        self.inflight = 0
        self.per_model: dict[Any, int] = {}  # ModelVersion -> requests in flight (absent when none)

    @property
    def enabled(self) -> bool:
        """Whether any bound is set (the Engine skips the bookkeeping otherwise)."""
        return self.server_limit > 0 or self.model_limit > 0

    def enter(self, mv: Any) -> None:
        """Admit one request to model version `mv` or raise ServiceError(UNAVAILABLE)."""
        if self.server_limit and self.inflight >= self.server_limit:
            raise ServiceError(
                ErrorCode.UNAVAILABLE,
                f"Server is busy: {self.inflight} inference requests in flight, the limit set by "
                "--max-inflight-requests; retry later",
            )
        count = self.per_model.get(mv, 0)
        if self.model_limit and count >= self.model_limit:
            raise ServiceError(
                ErrorCode.UNAVAILABLE,
                f"Model '{mv.name}' version {mv.version} is busy: {count} inference requests in flight, the "
                "limit set by --max-inflight-requests-per-model; retry later",
            )
        self.inflight += 1
        self.per_model[mv] = count + 1

    def leave(self, mv: Any) -> None:
        """A request admitted by enter(mv) got its final response."""
        self.inflight -= 1
        count = self.per_model.get(mv, 1) - 1
        if count > 0:
            self.per_model[mv] = count
        else:
            self.per_model.pop(mv, None)
