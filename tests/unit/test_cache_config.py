"""--cache-config parsing: the local and redis caches, Triton's redis keys and messages."""

from __future__ import annotations

import pytest

from service.config.cache_config import REDIS_ADDRESS_MESSAGE, parse_cache_settings


def test_redis_settings_and_credentials_from_the_environment() -> None:
    entries = ["redis,host=cache", "redis,port=6380", "redis,db=2", "redis,socket_timeout=50", "redis,pool_size=4"]
    cache = parse_cache_settings(entries, env={"TRITONCACHE_REDIS_USERNAME": "u", "TRITONCACHE_REDIS_PASSWORD": "p"})
    assert cache is not None and cache.kind == "redis" and cache.redis is not None
    r = cache.redis
    assert (r.host, r.port, r.db, r.socket_timeout_ms, r.pool_size) == ("cache", 6380, 2, 50, 4)
    assert (r.user, r.password, r.tls, r.wait_timeout_ms) == ("u", "p", False, 1000)
    explicit = parse_cache_settings([*entries, "redis,password=x"], env={"TRITONCACHE_REDIS_PASSWORD": "p"})
    assert explicit is not None and explicit.redis is not None and explicit.redis.password == "x"
    tls = parse_cache_settings(["redis,host=h", "redis,port=1", "redis,tls_enabled=true", "redis,cacert=/ca.pem"])
    assert tls is not None and tls.redis is not None and tls.redis.tls and tls.redis.cacert == "/ca.pem"


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["redis,host=h"], REDIS_ADDRESS_MESSAGE),
        (["redis"], "No cache specified. --cache-config option format is <cache name>,<setting>=<value>. Got redis"),
        (["redis,port"], "--cache-config option format is '<cache name>,<setting>=<value>'. Got redis,port"),
        (["redis,host=h", "redis,port=1", "redis,tls=yes"], "unknown 'redis' cache setting 'tls'"),
        (["local,size=10", "redis,host=h"], "only one cache can be configured, got local, redis"),
    ],
)
def test_bad_entries(entries: list[str], message: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_cache_settings(entries, env={})
    assert message in str(e.value)


def test_local() -> None:
    cache = parse_cache_settings(["local,size=1024"])
    assert cache is not None and (cache.kind, cache.size) == ("local", 1024)
    assert parse_cache_settings([]) is None
