"""`--cache-config <cache>,<key>=<value>`: the response cache's implementation and settings (docs/cache.md).

Two caches, as Triton ships them: `local` (size=<bytes>, an in-memory LRU) and `redis` (Triton's redis_cache
keys: host, port, user, password, db, connect_timeout, socket_timeout, pool_size, wait_timeout, tls_enabled,
cert, key, cacert, cacert_dir, sni; credentials also from TRITONCACHE_REDIS_USERNAME/_PASSWORD).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

REDIS_KEYS = frozenset(
    {
        "host",
        "port",
        "user",
        "password",
        "db",
        "connect_timeout",
        "socket_timeout",
        "pool_size",
        "wait_timeout",
        "tls_enabled",
        "cert",
        "key",
        "cacert",
        "cacert_dir",
        "sni",
    }
)
_REDIS_NUMBERS = ("port", "db", "connect_timeout", "socket_timeout", "pool_size", "wait_timeout")
# Triton's redis_cache message when host or port is missing
REDIS_ADDRESS_MESSAGE = (
    "Failed to initialize RedisCache, didn't specify address. Must at a minimum specify 'host' and 'port' in the "
    "configuration - e.g. tritonserver --cache-config redis,host=redis --cache-config redis,port=6379 "
    "--model-repository=/models ..."
)


@dataclass(slots=True)
class RedisSettings:
    """Where and how the Redis cache connects (timeouts in ms; 0 = Trireme's bound, see docs/cache.md)."""

    host: str
    port: int
    user: str = ""
    password: str = ""
    db: int = 0
    connect_timeout_ms: int = 0
    socket_timeout_ms: int = 0
    pool_size: int = 1
    wait_timeout_ms: int = 1000
    tls: bool = False
    cert: str = ""
    key: str = ""
    cacert: str = ""
    cacert_dir: str = ""
    sni: str = ""


@dataclass(slots=True)
class CacheSettings:
    """The one response cache the server runs: `local` with a byte budget, or `redis`."""

    kind: str
    size: int = 0
    redis: RedisSettings | None = None
    settings: dict[str, str] = field(default_factory=dict)


def parse_cache_settings(entries: list[str], env: dict[str, str] | None = None) -> CacheSettings | None:
    """The cache `--cache-config` entries describe, None without any. ValueError with Triton's message (the
    format errors) or a clear one (an unknown cache or key, a value that is not a number)."""
    if not entries:
        return None
    by_cache: dict[str, dict[str, str]] = {}
    for entry in entries:
        name, comma, setting = entry.partition(",")
        if not comma or not name:
            raise ValueError(
                f"No cache specified. --cache-config option format is <cache name>,<setting>=<value>. Got {entry}"
            )
        key, equals, value = setting.partition("=")
        if not equals:
            raise ValueError(f"--cache-config option format is '<cache name>,<setting>=<value>'. Got {entry}")
        by_cache.setdefault(name, {})[key] = value
    if len(by_cache) > 1:
        raise ValueError(f"only one cache can be configured, got {', '.join(sorted(by_cache))}")
    name, settings = next(iter(by_cache.items()))
    if name == "local":
        return CacheSettings("local", size=_local_size(settings), settings=settings)
    if name == "redis":
        return CacheSettings("redis", redis=_redis(settings, os.environ if env is None else env), settings=settings)
    raise ValueError(f"unsupported cache '{name}': the 'local' and 'redis' caches are available")


def _local_size(settings: dict[str, str]) -> int:
    for key in settings:
        if key != "size":
            raise ValueError(f"unknown 'local' cache setting '{key}' (expected size=<bytes>)")
    value = settings.get("size", "")
    if not value.isascii() or not value.isdigit():
        raise ValueError(f"'local' cache size must be a number of bytes, got '{value}'")
    return int(value)


def _redis(settings: dict[str, str], env: dict[str, str] | os._Environ[str]) -> RedisSettings:
    unknown = sorted(set(settings) - REDIS_KEYS)
    if unknown:
        raise ValueError(f"unknown 'redis' cache setting '{unknown[0]}' (known: {', '.join(sorted(REDIS_KEYS))})")
    if not settings.get("host") or not settings.get("port"):
        raise ValueError(REDIS_ADDRESS_MESSAGE)
    numbers = {}
    for key in _REDIS_NUMBERS:
        value = settings.get(key)
        if value is None:
            continue
        if not value.isascii() or not value.isdigit():
            raise ValueError(f"'redis' cache setting '{key}' must be a non-negative integer, got '{value}'")
        numbers[key] = int(value)
    return RedisSettings(
        host=settings["host"],
        port=numbers["port"],
        user=settings.get("user") or env.get("TRITONCACHE_REDIS_USERNAME", ""),
        password=settings.get("password") or env.get("TRITONCACHE_REDIS_PASSWORD", ""),
        db=numbers.get("db", 0),
        connect_timeout_ms=numbers.get("connect_timeout", 0),
        socket_timeout_ms=numbers.get("socket_timeout", 0),
        pool_size=max(1, numbers.get("pool_size", 1)),
        wait_timeout_ms=numbers.get("wait_timeout", 1000),
        tls=settings.get("tls_enabled", "") == "true",
        cert=settings.get("cert", ""),
        key=settings.get("key", ""),
        cacert=settings.get("cacert", ""),
        cacert_dir=settings.get("cacert_dir", ""),
        sni=settings.get("sni", ""),
    )
