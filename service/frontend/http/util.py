"""Small helpers every HTTP handler module shares: JSON and error responses, body reading, compression."""

from __future__ import annotations

import logging
import re

import numpy as np
import orjson
from aiohttp import StreamReader, web

from service.errors import ErrorCode, ServiceError, invalid_arg
from service.frontend.status import HTTP_STATUS
from shm.errors import ShmError

log = logging.getLogger("trireme.http")

JSON = "application/json"
_COMPRESSIONS = ("gzip", "deflate")
MAX_JSON_DEPTH = 100  # Triton 2.73's nesting limit for request JSON
MAX_REQUEST_CHUNKS = 65536  # Triton 2.69: a chunked request body may come in at most this many chunks
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)  # a JSON string (its brackets are not nesting)
_OPEN = np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


def check_json_depth(raw: bytes | memoryview) -> None:
    """400 when the JSON text nests arrays/objects deeper than MAX_JSON_DEPTH (Triton's message).

    Cheap for ordinary bodies: a body with at most MAX_JSON_DEPTH brackets cannot be deeper, and the others are
    measured with numpy (strings blanked first, so brackets inside them do not count)."""
    data = bytes(raw)
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return
    if b'"' in data:
        data = _STRING.sub(b'""', data)
    moves = _OPEN[np.frombuffer(data, np.uint8)]
    moves = moves[moves != 0]  # only the brackets
    if int(np.cumsum(moves, dtype=np.int64).max()) > MAX_JSON_DEPTH:
        raise invalid_arg(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})")


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
    if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
        return await _read_chunked(content, max_size)
    while chunk := await content.readany():
        size += len(chunk)
        _check_size(size, max_size)
        chunks.append(chunk)
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


def _check_size(size: int, max_size: int) -> None:
    if size > max_size:  # counted after decompression: a gzip/deflate bomb stops here
        raise invalid_arg(
            f"Request JSON size exceeds the maximum allowed value of {max_size} bytes. "
            "Use --http-max-input-size to increase the limit."
        )


async def _read_chunked(content: StreamReader, max_size: int) -> bytes:
    """A Transfer-Encoding: chunked body, at most MAX_REQUEST_CHUNKS HTTP chunks of it (Triton 2.69's cap: a
    flood of tiny chunks costs the server far more than its bytes)."""
    parts: list[bytes] = []
    size = count = 0
    while True:
        data, chunk_end = await content.readchunk()
        if not data and not chunk_end:
            break
        if chunk_end:
            count += 1
            if count > MAX_REQUEST_CHUNKS:
                raise invalid_arg(
                    f"HTTP request body has more than {MAX_REQUEST_CHUNKS} chunks; send it in fewer, larger chunks"
                )
        if data:
            size += len(data)
            _check_size(size, max_size)
            parts.append(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def read_json_object(request: web.Request, max_size: int) -> dict:
    """The body as a JSON object ({} when empty); a body that does not parse is 400."""
    raw = await read_body(request, max_size)
    if not raw.strip():
        return {}
    check_json_depth(raw)
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
