"""OpenAI's error JSON: `{"error": {"message", "type", "param", "code"}}` with the HTTP status that goes with it.

Core errors (ServiceError) keep the status of the one table (status.HTTP_STATUS); the OpenAI `type` follows
the status the way OpenAI's API answers: 4xx `invalid_request_error` (401 `authentication_error`), 5xx
`server_error`.
"""

from __future__ import annotations

import logging

import orjson
from aiohttp import web

from service.errors import ServiceError
from service.frontend.status import HTTP_STATUS

log = logging.getLogger("trireme.openai")

JSON = "application/json"


class OpenAIError(Exception):
    """An error answered as OpenAI's error JSON."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    @property
    def type(self) -> str:
        """OpenAI's error type for the status."""
        if self.status == 401:
            return "authentication_error"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict:
        """The JSON object."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    """400 invalid_request_error."""
    return OpenAIError(400, message, None, param)


def model_not_found(model: str) -> OpenAIError:
    """404 as OpenAI answers an unknown model."""
    return OpenAIError(404, f"The model '{model}' does not exist", "model_not_found", "model")


def to_openai_error(e: BaseException) -> OpenAIError:
    """Any exception as an OpenAIError; unexpected ones are 500 and logged."""
    if isinstance(e, OpenAIError):
        return e
    if isinstance(e, ServiceError):
        return OpenAIError(HTTP_STATUS[e.code], e.message)
    log.exception("internal error", exc_info=e)
    return OpenAIError(500, f"{type(e).__name__}: {e}")


def error_response(e: BaseException) -> web.Response:
    """The JSON error response for `e`."""
    err = to_openai_error(e)
    return web.Response(body=orjson.dumps(err.body()), status=err.status, content_type=JSON)
