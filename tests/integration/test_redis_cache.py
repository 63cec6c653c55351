"""The Redis response cache through real servers and a real redis-server: the local cache's hit/miss semantics
and statistics, two replicas sharing entries, Redis going away and coming back, passwords, bad settings."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.certs import CertFiles, make_certs
from tests.conftest import ROOT, free_port, write_model
from tests.integration.metrics_scrape import scrape
from tests.integration.test_response_cache import COUNTING_PY, calls, counting_config, infer, stats

pytest.importorskip("redis", reason="the redis client is the optional extra trireme[redis]")
if shutil.which("redis-server") is None:
    pytest.skip("redis-server is not installed (tools/test.sh installs the Debian package)", allow_module_level=True)


class RedisServer:
    """A redis-server on a free port (no persistence), stopped by `stop`."""

    def __init__(self, workdir: Path, port: int = 0, password: str = "", certs: CertFiles | None = None) -> None:
        self.port = port or free_port()
        self.password = password
        self.certs = certs
        ports = ["--port", "0", "--tls-port", str(self.port)] if certs else ["--port", str(self.port)]
        args = ["redis-server", *ports, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(workdir)]
        if password:
            args += ["--requirepass", password]
        if certs:  # TLS only, and clients must show a certificate the CA signed (Redis's default)
            args += ["--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key)]
            args += ["--tls-ca-cert-file", str(certs.ca)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while self._ping() is False:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def client(self) -> Any:
        import redis

        tls: dict[str, Any] = {}
        if self.certs:
            c = self.certs
            tls = {"ssl": True, "ssl_certfile": str(c.client_cert), "ssl_keyfile": str(c.client_key)}
            tls.update(ssl_ca_certs=str(c.ca), ssl_check_hostname=False)
        return redis.Redis(port=self.port, password=self.password or None, socket_timeout=1, **tls)

    def _ping(self) -> bool:
        import redis

        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def keys(self) -> list[bytes]:
        return list(self.client().keys("trireme:*"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("redis_repo")
    write_model(repo, "counting", counting_config("counting"), COUNTING_PY)
    write_model(repo, "uncached", counting_config("uncached").replace("enable: true", "enable: false"), COUNTING_PY)
    return repo


def redis_flags(port: int, *extra: str) -> list[str]:
    return ["--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={port}", *extra]


def client_of(server: Any) -> Any:
    return grpcclient.InferenceServerClient(server.url)


def test_hits_misses_and_statistics_as_the_local_cache(
    start_server: Any, repo: Path, redis_server: RedisServer
) -> None:
    server = start_server([repo], redis_flags(redis_server.port))
    c = client_of(server)
    x = np.arange(8, dtype=np.float32)
    first, second = infer(c, "counting", x), infer(c, "counting", x)
    assert calls(first) == calls(second) == 1  # the model ran once
    assert list(first.get_response().raw_output_contents) == list(second.get_response().raw_output_contents)
    assert calls(infer(c, "counting", x + 1)) == 2  # other bytes: a miss
    only_out = infer(c, "counting", x, outputs=["OUT"])  # the requested outputs are part of the key
    assert only_out.as_numpy("CALLS") is None
    assert [calls(infer(c, "uncached", x)) for _ in range(2)] == [1, 2]
    s = stats(c, "counting")
    assert s.inference_stats.cache_hit.count == 1 and s.inference_stats.cache_miss.count == 3
    assert s.execution_count == 3 and s.inference_stats.success.count == 4
    assert len(redis_server.keys()) == 3  # the entries live in Redis
    m = scrape(server.metrics_url)
    labels = {"model": "counting", "version": "1"}
    assert m.value("nv_cache_num_hits_per_model", **labels) == 1
    assert m.value("nv_cache_num_misses_per_model", **labels) == 3
    assert m.value("trireme_cache_failures_total") == 0
    c.close()


def test_two_replicas_share_one_redis(start_server: Any, repo: Path, redis_server: RedisServer) -> None:
    one = start_server([repo], redis_flags(redis_server.port))
    two = start_server([repo], redis_flags(redis_server.port))
    c1, c2 = client_of(one), client_of(two)
    x = np.full(5, 3, np.float32)
    assert calls(infer(c1, "counting", x)) == 1  # replica one runs its model and stores the answer
    from_two = infer(c2, "counting", x)  # replica two answers from replica one's entry
    assert calls(from_two) == 1
    np.testing.assert_array_equal(from_two.as_numpy("OUT"), x * 2)
    assert stats(c2, "counting").execution_count == 0  # its model never ran
    assert stats(c2, "counting").inference_stats.cache_hit.count == 1
    y = np.full(5, 4, np.float32)
    assert calls(infer(c2, "counting", y)) == 1  # and the other way round
    assert calls(infer(c1, "counting", y)) == 1
    assert stats(c1, "counting").execution_count == 1
    c1.close()
    c2.close()


def test_redis_down_serves_misses_logs_once_and_recovers(start_server: Any, repo: Path, tmp_path: Path) -> None:
    redis_server = RedisServer(tmp_path)
    server = start_server([repo], redis_flags(redis_server.port))
    c = client_of(server)
    x = np.arange(3, dtype=np.float32)
    assert calls(infer(c, "counting", x)) == 1
    assert calls(infer(c, "counting", x)) == 1
    redis_server.stop()
    runs = [calls(infer(c, "counting", x)) for _ in range(6)]
    assert runs == [2, 3, 4, 5, 6, 7]  # every request answered, by the model: misses
    log = server.log()
    assert log.count("requests are served as cache misses") == 1, log
    assert scrape(server.metrics_url).value("trireme_cache_failures_total") >= 1
    assert stats(c, "counting").inference_stats.cache_miss.count == 7
    back = RedisServer(tmp_path, port=redis_server.port)  # Redis returns (empty) on the same port
    try:
        deadline = time.monotonic() + 30
        while "is back" not in server.log():  # the first request after the one-second rest tries again
            assert time.monotonic() < deadline, server.log()
            infer(c, "counting", x)
            time.sleep(0.2)
        before = calls(infer(c, "counting", x + 10))
        assert calls(infer(c, "counting", x + 10)) == before  # cached again
    finally:
        back.stop()
    c.close()


def test_unreachable_at_start_still_serves(start_server: Any, repo: Path) -> None:
    server = start_server([repo], redis_flags(free_port()))
    c = client_of(server)
    x = np.ones(2, np.float32)
    assert [calls(infer(c, "counting", x)) for _ in range(3)] == [1, 2, 3]
    assert server.log().count("requests are served as cache misses") == 1
    c.close()


def test_password(start_server: Any, repo: Path, tmp_path: Path) -> None:
    redis_server = RedisServer(tmp_path, password="s3cret")
    try:
        server = start_server([repo], redis_flags(redis_server.port, "--cache-config", "redis,password=s3cret"))
        c = client_of(server)
        x = np.ones(4, np.float32)
        assert [calls(infer(c, "counting", x)) for _ in range(2)] == [1, 1]
        assert len(redis_server.keys()) == 1
        wrong = start_server([repo], redis_flags(redis_server.port, "--cache-config", "redis,password=nope"))
        c2 = client_of(wrong)
        assert [calls(infer(c2, "counting", x)) for _ in range(2)] == [1, 2]  # refused by Redis: misses
        assert scrape(wrong.metrics_url).value("trireme_cache_failures_total") >= 1
        c.close()
        c2.close()
    finally:
        redis_server.stop()


def test_tls(start_server: Any, repo: Path, tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    redis_server = RedisServer(tmp_path, certs=certs)
    try:
        tls = [f"redis,{k}={v}" for k, v in (("cert", certs.client_cert), ("key", certs.client_key))]
        tls += ["redis,tls_enabled=true", f"redis,cacert={certs.ca}"]
        server = start_server([repo], redis_flags(redis_server.port, *(a for t in tls for a in ("--cache-config", t))))
        c = client_of(server)
        x = np.full(3, 9, np.float32)
        assert [calls(infer(c, "counting", x)) for _ in range(2)] == [1, 1]  # stored and found over TLS
        assert len(redis_server.keys()) == 1
        plain = start_server([repo], redis_flags(redis_server.port))  # no TLS: Redis does not answer it
        c2 = client_of(plain)
        assert [calls(infer(c2, "counting", x)) for _ in range(2)] == [1, 2]
        assert plain.log().count("requests are served as cache misses") == 1
        c.close()
        c2.close()
    finally:
        redis_server.stop()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--cache-config", "redis,host=127.0.0.1"], "Failed to initialize RedisCache, didn't specify address."),
        (["--cache-config", "redis,port=1", "--cache-config", "redis,colour=blue"], "unknown 'redis' cache setting"),
        (["--cache-config", "redis,host=h", "--cache-config", "redis,port=x"], "must be a non-negative integer"),
        (["--cache-config", "redis"], "No cache specified. --cache-config option format is"),
        (["--cache-config", "redis,host"], "--cache-config option format is '<cache name>,<setting>=<value>'"),
        (["--cache-config", "memcached,host=h"], "unsupported cache 'memcached'"),
    ],
)
def test_bad_cache_config_stops_the_server(flags: list[str], message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "service", "serve", *flags], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0
    assert message in out.stderr, out.stderr
