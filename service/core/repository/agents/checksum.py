"""Triton's checksum repository agent: parameters `MD5:<path relative to the model folder>` = expected digest;
a file whose digest differs (or that cannot be read) fails the load with the agent's message."""

from __future__ import annotations

import hashlib
import os

from service.core.repository.agents.model import LOAD, AgentModel
from service.errors import ErrorCode, ServiceError


class ChecksumAgent:
    """The built-in `checksum` agent (Triton: libtritonrepoagent_checksum.so)."""

    def model_action(self, action: str, model: AgentModel) -> None:
        if action != LOAD:  # like Triton's: only LOAD is handled
            return
        for key, expected in model.parameters.items():
            algorithm, sep, relative = key.partition(":")
            if not sep:
                raise ServiceError(ErrorCode.INVALID_ARG, f"failed to parse key: {key}")
            if algorithm.lower() != "md5":
                raise ServiceError(ErrorCode.UNSUPPORTED, f"Unsupported checksum algorithm: {algorithm}")
            try:
                with open(os.path.join(model.location, relative), "rb") as f:
                    got = hashlib.md5(f.read(), usedforsecurity=False).hexdigest()
            except OSError as e:
                raise ServiceError(
                    ErrorCode.INVALID_ARG, f"failed to open text file for read {relative}: {e.strerror}"
                ) from None
            if got != expected:
                raise ServiceError(
                    ErrorCode.INVALID_ARG, f"Mismatched MD5 hash for file {relative}, expect: {expected}, got: {got}"
                )
