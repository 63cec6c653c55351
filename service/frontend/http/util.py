"""Small helpers every HTTP handler module shares: JSON and error responses, body reading, compression."""

from __future__ import annotations

import logging

import orjson
from aiohttp import web

from service.errors import ErrorCode, ServiceError, invalid_arg
from service.frontend.status import HTTP_STATUS
from shm.errors import ShmError

log = logging.getLogger("trireme.http")

JSON = "application/json"
_COMPRESSIONS = ("gzip", "deflate")


def error_body(message: str) -> bytes:
    """Triton's JSON error body."""
    return orjson.dumps({"error": message})


def json_response(value: object, status: int = 200) -> web.Response:
    """A JSON body (orjson)."""
    return web.Response(body=orjson.dumps(value), status=status, content_type=JSON)


def to_service_error(e: Exception) -> ServiceError:
    """Any exception as a ServiceError; unexpected ones become INTERNAL and are logged."""
    if isinstance(e, ServiceError):
        return e
    if isinstance(e, ShmError):
        return ServiceError(ErrorCode[e.code], e.message)
    log.exception("internal error", exc_info=e)
    return ServiceError(ErrorCode.INTERNAL, f"{type(e).__name__}: {e}")


def error_response(e: Exception) -> web.Response:
    """Triton's JSON error with the status the code maps to."""
    err = to_service_error(e)
    return web.Response(body=error_body(err.message), status=HTTP_STATUS[err.code], content_type=JSON)


async def read_body(request: web.Request, max_size: int) -> bytes:
    """The (decompressed) request body; unsupported encodings are 501, bodies over max_size 400.

    Chunks are joined once (a body that arrived in one chunk is not copied at all), where
    `web.Request.read()` would copy a large body twice.
    """
    encoding = request.headers.get("Content-Encoding")
    if encoding and encoding.lower() not in ("gzip", "deflate", "identity"):
        raise ServiceError(ErrorCode.UNSUPPORTED, "Unsupported compression type")
    chunks: list[bytes] = []
    size = 0
    content = request.content
    while chunk := await content.readany():
        size += len(chunk)
        if size > max_size:
            raise invalid_arg(
                f"Request JSON size exceeds the maximum allowed value of {max_size} bytes. "
                "Use --http-max-input-size to increase the limit."
            )
        chunks.append(chunk)
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


async def read_json_object(request: web.Request, max_size: int) -> dict:
    """The body as a JSON object ({} when empty); a body that does not parse is 400."""
    raw = await read_body(request, max_size)
    if not raw.strip():
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise invalid_arg(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(value, dict):
        raise invalid_arg("the request body must be a JSON object")
    return value


def compress_if_asked(request: web.Request, response: web.Response) -> web.Response:
    """Compress the response when the client accepts gzip or deflate."""
    accept = request.headers.get("Accept-Encoding")
    if accept and any(c in accept for c in _COMPRESSIONS):
        response.enable_compression()
    return response
