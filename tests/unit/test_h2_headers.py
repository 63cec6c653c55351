"""The h2 transport's header handling: grpc-message percent-encoding, grpc-timeout, and the decoded-block cache,
which must give exactly what a fresh HPACK decode gives while a client's encoder indexes and evicts entries."""

from __future__ import annotations

import pytest

hpack = pytest.importorskip("hpack", reason="hpack is not installed (trireme[grpc-h2])")

from service.frontend.grpc.h2.frames import parse_timeout, percent  # noqa: E402
from service.frontend.grpc.h2.headers import HeaderDecoder, read_head  # noqa: E402


def test_percent_encoding_and_timeouts() -> None:
    assert percent("plain text: ok") == b"plain text: ok"
    assert percent("100% é\n") == b"100%25 %C3%A9%0A"
    assert parse_timeout(b"250m") == pytest.approx(0.25)
    assert parse_timeout(b"2S") == 2.0 and parse_timeout(b"1H") == 3600.0
    assert parse_timeout(b"x") is None and parse_timeout(b"123456789S") is None  # 9 digits: malformed


def _call(path: str, extra: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":path", path), ("content-type", "application/grpc"), ("te", "trailers"), *extra]


def test_cache_matches_a_fresh_decode() -> None:
    enc = hpack.Encoder()
    enc.header_table_size = 256  # small: later headers evict earlier entries
    cached, fresh = HeaderDecoder(), hpack.Decoder()
    calls = [
        _call("/s/A", [("x-key", "1")]),
        _call("/s/A", [("x-key", "1")]),  # the same bytes: replayed from the cache
        _call("/s/B", [("x-key", "2"), ("trace-bin", "AAEC")]),
        _call("/s/A", [("x-key", "1"), ("x-long", "v" * 120)]),  # evicts: indexes shift
        _call("/s/A", [("x-key", "1")]),
        _call("/s/A", [("grpc-timeout", "5S")]),
    ]
    for headers in calls:
        block = enc.encode(headers)
        got = cached.decode(block)
        want = read_head(fresh.decode(block, raw=True))
        assert got == want
    assert got.timeout == 5.0 and got.path == "/s/A"
    assert read_head(hpack.Decoder().decode(hpack.Encoder().encode(calls[2]), raw=True)).metadata == (
        ("x-key", "2"),
        ("trace-bin", b"\x00\x01\x02"),
    )
