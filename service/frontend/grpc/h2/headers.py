"""Request header blocks: HPACK decoded by the `hpack` library, with decoded blocks cached by their raw bytes
while that is sound, and read into what a call needs (path, deadline, encodings, the metadata its handler sees)."""

from __future__ import annotations

from dataclasses import dataclass

from hpack import Decoder
from hpack.table import HeaderTable

from service.frontend.grpc.h2.frames import decode_bin, parse_timeout

ENCODINGS = ("identity", "gzip", "deflate")
# headers grpc core keeps to itself: the handler's invocation_metadata never shows them
_RESERVED = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"))
_CACHED = 256


class _CountingTable(HeaderTable):
    """hpack's header table with a generation number that moves whenever an entry is added."""

    generation = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.generation += 1
        super().add(name, value)


@dataclass(frozen=True)
class RequestHead:
    path: str
    reset: bool  # not a gRPC request at all (grpc core resets the stream): see read_head
    error: str  # a malformed request: INTERNAL with this message
    timeout: float | None  # grpc-timeout in seconds
    encoding: str  # grpc-encoding of the request messages
    encoding_error: str  # an encoding this server does not accept: UNIMPLEMENTED with this message
    accept_encoding: tuple[str, ...]
    metadata: tuple[tuple[str, str | bytes], ...]


_SCHEMES = frozenset((b"http", b"https"))


def read_head(headers: list[tuple[bytes, bytes]]) -> RequestHead:
    """The call a request header block asks for, checked as grpc core's server checks it: with no :method POST,
    no :scheme, :path, :authority (or host) or te, the stream is reset (RST_STREAM INTERNAL_ERROR); a te other
    than "trailers", a :scheme other than http/https, an unknown pseudo-header or a header name with capitals
    ends the call with INTERNAL and grpc core's message. Any content-type is taken, as grpc core takes it."""
    path, encoding, timeout = "", "identity", None
    method = scheme = authority = host = te = illegal = b""
    accept: tuple[str, ...] = ()
    metadata: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name[:1] == b":":
            if name == b":path":
                path = value.decode("latin-1")
            elif name == b":method":
                method = value
            elif name == b":scheme":
                scheme = value
            elif name == b":authority":
                authority = value
            else:
                illegal = illegal or name
        elif name in _RESERVED:
            if name == b"te":
                te = value
            elif name == b"grpc-timeout":
                timeout = parse_timeout(value)
            elif name == b"grpc-encoding":
                encoding = value.decode("latin-1").strip()
            elif name == b"grpc-accept-encoding":
                accept = tuple(e.strip() for e in value.decode("latin-1").split(","))
        elif name == b"host":  # grpc core takes it for a missing :authority
            host = value
        elif name.lower() != name:
            illegal = illegal or name
        elif name.endswith(b"-bin"):
            try:
                metadata.append((name.decode("latin-1"), decode_bin(value)))
            except ValueError:
                continue  # grpc core drops a value that is not base64
        else:
            metadata.append((name.decode("latin-1"), value.decode("utf-8", "replace")))
    reset = method != b"POST" or not scheme or not path or not (authority or host) or not te
    if illegal:
        error = f"Illegal header key: {illegal.decode('latin-1')}"
    elif te != b"trailers":
        error = "Error parsing 'te' metadata"
    elif scheme not in _SCHEMES:
        error = "Error parsing ':scheme' metadata"
    else:
        error = ""
    encoding_error = (
        "" if encoding in ENCODINGS else f"Compression algorithm '{encoding}' is not supported (grpc-encoding)"
    )
    return RequestHead(path, reset, error, timeout, encoding, encoding_error, accept, tuple(metadata))


class HeaderDecoder:
    """One connection's HPACK decoder and its cache of decoded blocks.

    A block's decoded headers can be replayed from a cache keyed by its raw bytes only while the dynamic table is
    exactly as it was when the block was decoded and if decoding it changed nothing in the table: then skipping
    the decode is invisible. A block whose decode moved the table is never cached, and every such change empties
    the cache. grpc core clients index their headers on a connection's first call and then send the very same
    bytes for each call to a method, so later calls are cache hits; blocks with per-call values (grpc-timeout)
    miss and decode normally."""

    def __init__(self) -> None:
        self._decoder = Decoder()
        self._table = _CountingTable()
        self._decoder.header_table = self._table
        self._cache: dict[bytes, RequestHead] = {}

    def decode(self, block: bytes) -> RequestHead:
        hit = self._cache.get(block)
        if hit is not None:
            return hit
        before = (self._table.generation, self._table.maxsize)
        head = read_head(self._decoder.decode(block, raw=True))  # type: ignore[arg-type]
        if (self._table.generation, self._table.maxsize) != before:
            self._cache.clear()
        else:
            if len(self._cache) >= _CACHED:
                self._cache.clear()
            self._cache[block] = head
        return head
