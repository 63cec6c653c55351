"""The Redis response cache (`--cache-config redis,host=...,port=...`): the local cache's keys and semantics in a
Redis server that several Trireme replicas can share.

Entries are msgpack values under `trireme:<hex key>` (the key derivation is the local cache's, so every replica
computes the same key for the same request). Redis calls run on the caller's thread with bounded timeouts. When
Redis fails (down, unreachable, timing out) the request is served as a miss, the failure is counted and logged
once; for a second after a failure the cache is not tried at all, then the next request tries again (and logs
once that Redis is back).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import msgspec

from service.config.cache_config import RedisSettings
from service.core.pipeline.response_cache import CacheCounters, CachedResponse
from service.types import OutputTensor, ParamValue

log = logging.getLogger("trireme.cache")

KEY_PREFIX = b"trireme:"
RETRY_AFTER_S = 1.0  # after a failure, requests skip Redis this long (no timeout paid per request)
DEFAULT_TIMEOUT_MS = 1000  # what Triton's 0 ("wait forever") means here: the server's event loop must not hang

# (outputs as (name, datatype, shape, bytes), parameters as (name, value))
_Entry = tuple[list[tuple[str, str, list[int], bytes]], list[tuple[str, Any]]]
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(type=_Entry).decode


def connect(settings: RedisSettings) -> Any:
    """A redis-py client over a blocking pool of `pool_size` connections (no I/O yet)."""
    import redis

    kwargs: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "db": settings.db,
        "username": settings.user or None,
        "password": settings.password or None,
        "socket_connect_timeout": (settings.connect_timeout_ms or DEFAULT_TIMEOUT_MS) / 1000,
        "socket_timeout": (settings.socket_timeout_ms or DEFAULT_TIMEOUT_MS) / 1000,
    }
    connection_class: Any = redis.Connection
    if settings.tls:
        connection_class = redis.SSLConnection
        kwargs.update(
            ssl_certfile=settings.cert or None,
            ssl_keyfile=settings.key or None,
            ssl_ca_certs=settings.cacert or None,
            ssl_ca_path=settings.cacert_dir or None,
            ssl_check_hostname=False,
            ssl_cert_reqs="required" if settings.cacert or settings.cacert_dir else "none",
        )
    pool = redis.BlockingConnectionPool(
        max_connections=settings.pool_size,
        timeout=settings.wait_timeout_ms / 1000,
        connection_class=connection_class,
        **kwargs,
    )
    return redis.Redis(connection_pool=pool)


class RedisResponseCache:
    """The ResponseCache interface (lookup, insert, counters) over a Redis server."""

    def __init__(self, settings: RedisSettings, client: Any = None) -> None:
        self.settings = settings
        self.where = f"{settings.host}:{settings.port}"
        self.client = client if client is not None else connect(settings)
        self.counters = CacheCounters()
        self._lock = threading.Lock()
        self._down_until = 0.0  # monotonic time before which Redis is not tried
        self._down = False

    def check(self) -> None:
        """Ping once at start: log where the cache is, or (once) that it cannot be reached yet."""
        self._call(self.client.ping)
        if not self._down:
            log.info("response cache: Redis at %s", self.where)

    def lookup(self, key: bytes) -> CachedResponse | None:
        """The cached response for `key`, or None (a miss, also when Redis cannot answer)."""
        value = self._call(self.client.get, KEY_PREFIX + key.hex().encode())
        entry = None
        if value is not None:
            try:
                outputs, parameters = _decode(value)
                entry = CachedResponse(
                    tuple(OutputTensor(n, d, list(s), b) for n, d, s, b in outputs), tuple(parameters), len(value)
                )
            except msgspec.DecodeError:  # not written by Trireme: a miss (the model's answer replaces it)
                entry = None
        with self._lock:
            self.counters.lookups += 1
            if entry is None:
                self.counters.misses += 1
            else:
                self.counters.hits += 1
        return entry

    def insert(self, key: bytes, outputs: list[OutputTensor], parameters: dict[str, ParamValue]) -> bool:
        """Store a response; False when Redis could not take it."""
        value = _encode(
            (
                [(o.name, o.datatype, list(o.shape), bytes(o.data) if o.data is not None else b"") for o in outputs],
                list(parameters.items()),
            )
        )
        if self._call(self.client.set, KEY_PREFIX + key.hex().encode(), value) is None:
            return False
        with self._lock:
            self.counters.inserts += 1
        return True

    def utilization(self) -> float:
        """Redis manages its own memory: nothing to report here."""
        return 0.0

    def _call(self, fn: Any, *args: Any) -> Any:
        """fn(*args), or None when Redis fails (counted; logged once per outage) or is resting after a failure."""
        import redis

        if self._down and time.monotonic() < self._down_until:
            return None
        try:
            result = fn(*args)
        except redis.RedisError as e:
            with self._lock:
                self.counters.failures += 1
                first = not self._down
                self._down, self._down_until = True, time.monotonic() + RETRY_AFTER_S
            if first:
                log.warning(
                    "response cache: Redis at %s failed (%s: %s); requests are served as cache misses until it "
                    "answers again",
                    self.where,
                    type(e).__name__,
                    e,
                )
            return None
        if self._down:
            self._down = False
            log.info("response cache: Redis at %s is back", self.where)
        return result
