"""Small helpers every HTTP handler module shares: JSON and error responses, body reading, compression."""

from __future__ import annotations

import gzip
import logging
import re
import zlib

import numpy as np
import orjson

from service.errors import ErrorCode, ServiceError, invalid_arg
from service.frontend.http.message import JSON, Request, Response
from service.frontend.status import HTTP_STATUS
from shm.errors import ShmError

log = logging.getLogger("trireme.http")

_INFLATE_PIECE = 1 << 20  # decompressed bytes per step
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


def json_response(value: object, status: int = 200) -> Response:
    """A JSON body (orjson)."""
    return Response(status, orjson.dumps(value), JSON)


def error_json(message: str, status: int) -> Response:
    """`{"error": message}` with that status."""
    return Response(status, error_body(message), JSON)


def to_service_error(e: Exception) -> ServiceError:
    """Any exception as a ServiceError; unexpected ones become INTERNAL and are logged."""
    if isinstance(e, ServiceError):
        return e
    if isinstance(e, ShmError):
        return ServiceError(ErrorCode[e.code], e.message)
    log.exception("internal error", exc_info=e)
    return ServiceError(ErrorCode.INTERNAL, f"{type(e).__name__}: {e}")


def error_response(e: Exception) -> Response:
    """Triton's JSON error with the status the code maps to."""
    err = to_service_error(e)
    return error_json(err.message, HTTP_STATUS[err.code])


class _Inflate:
    """gzip / deflate (zlib-wrapped, or raw when the first byte is not a zlib header) in bounded pieces: a
    decompression bomb is stopped by the size check between pieces."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._gzip = encoding == "gzip"
        self._z: zlib._Decompress | None = None

    def feed(self, data: bytes) -> list[bytes]:
        if self._z is None:
            raw = not self._gzip and bool(data) and data[0] & 0x0F != 8
            wbits = 16 + zlib.MAX_WBITS if self._gzip else -zlib.MAX_WBITS if raw else zlib.MAX_WBITS
            self._z = zlib.decompressobj(wbits)
        out = []
        try:
            while data:
                piece = self._z.decompress(data, _INFLATE_PIECE)
                if piece:
                    out.append(piece)
                data = self._z.unconsumed_tail
        except zlib.error:
            raise invalid_arg(f"Can not decode content-encoding: {self.encoding}") from None
        return out


def _coding(request: Request) -> str:
    """The Content-Encoding to undo ("gzip" or "deflate"; "" for none or identity); 501 for an unsupported one."""
    encoding = request.headers.get("Content-Encoding")
    if not encoding:
        return ""
    coding = encoding.lower()
    if coding not in ("gzip", "deflate", "identity"):
        raise ServiceError(ErrorCode.UNSUPPORTED, "Unsupported compression type")
    return "" if coding == "identity" else coding


def whole_body(request: Request, max_size: int) -> bytes | None:
    """read_body's answer when it needs no waiting: the body arrived whole and is not compressed (returned without
    a copy, its size checked); None otherwise (then await read_body)."""
    body = request.body
    if body.chunks > MAX_REQUEST_CHUNKS or _coding(request):
        return None
    whole = body.whole()
    if whole is not None:
        _check_size(len(whole), max_size, False)
    return whole


async def read_body(request: Request, max_size: int) -> bytes:
    """The (decompressed) request body; unsupported encodings are 501, bodies over max_size 400, a chunked body
    of more than MAX_REQUEST_CHUNKS chunks 400 (Triton 2.69's cap: a flood of tiny chunks costs the server far
    more than its bytes). A body that arrived whole and uncompressed is returned without a copy (whole_body)."""
    whole = whole_body(request, max_size)
    if whole is not None:
        return whole
    coding = _coding(request)
    inflate = _Inflate(coding) if coding else None
    body = request.body
    declared = request.headers.get("Content-Length")
    if inflate is None and declared is not None and declared.isdigit():
        _check_size(int(declared), max_size, False)  # refused before its bytes are read
    parts: list[bytes] = []
    size = 0
    while (data := await body.read()) is not None:
        _check_chunks(body.chunks)
        for piece in inflate.feed(data) if inflate is not None else (data,):
            size += len(piece)
            _check_size(size, max_size, inflate is not None)
            parts.append(piece)
    _check_chunks(body.chunks)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _check_chunks(count: int) -> None:
    if count > MAX_REQUEST_CHUNKS:
        raise invalid_arg(
            f"HTTP request body has more than {MAX_REQUEST_CHUNKS} chunks; send it in fewer, larger chunks"
        )


def _check_size(size: int, max_size: int, decompressed: bool) -> None:
    """Triton 2.73's two messages: one for a body over the limit as sent, one for a body that grows past it while
    it is decompressed (counted after decompression: a gzip/deflate bomb stops here)."""
    if size <= max_size:
        return
    if decompressed:
        raise invalid_arg(
            f"Decompressed data size exceeds the maximum allowed value of {max_size} bytes. "
            "Use --http-max-input-size to increase the limit."
        )
    raise invalid_arg(
        f"request JSON size of {size} bytes exceeds the maximum allowed input size of {max_size} bytes. "
        "Use --http-max-input-size to increase the limit."
    )


_SMALL_JSON = 64 << 10  # a body this small is parsed before its depth is checked (orjson stops at 1024 itself)


async def read_json_object(request: Request, max_size: int, depth_last: bool = False) -> dict:
    """The body as a JSON object ({} when empty); a body that does not parse is 400. With `depth_last` a small
    body is parsed first and the nesting limit applies only where it does not parse (Triton's admin handlers
    parse the whole body and then check the one value they read)."""
    raw = await read_body(request, max_size)
    if not raw.strip():
        return {}
    if not depth_last or len(raw) > _SMALL_JSON:
        check_json_depth(raw)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        check_json_depth(raw)
        raise invalid_arg(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(value, dict):
        raise invalid_arg("the request body must be a JSON object")
    return value


def compress_if_asked(request: Request, response: Response) -> Response:
    """Compress the response (deflate first, then gzip) when the client accepts it."""
    accept = request.headers.get("Accept-Encoding")
    if accept and response.body:
        accept = accept.lower()
        if "deflate" in accept:
            response.body = zlib.compress(response.body)
            response.headers["Content-Encoding"] = "deflate"
        elif "gzip" in accept:
            response.body = gzip.compress(response.body, mtime=0)
            response.headers["Content-Encoding"] = "gzip"
    return response
