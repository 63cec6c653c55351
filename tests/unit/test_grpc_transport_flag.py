"""--grpc-transport: the default (h2, or $TRIREME_GRPC_TRANSPORT), and the flags the native transport refuses."""

from __future__ import annotations

import importlib.util

import pytest

from service.config.flags import parse_args

HAVE_NATIVE = importlib.util.find_spec("pygrpc_native") is not None
# connection-age and ping-limit flags: native refuses every one, h2 and grpcio take them
AGE_AND_PING_FLAGS = [
    "--grpc-max-connection-age=1000",
    "--grpc-max-connection-age-grace=1000",
    "--grpc-http2-max-pings-without-data=0",
    "--grpc-http2-min-recv-ping-interval-without-data=1000",
    "--grpc-http2-max-ping-strikes=0",
]


def test_default_is_h2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIREME_GRPC_TRANSPORT", raising=False)
    assert parse_args([]).grpc.transport == "h2"
    monkeypatch.setenv("TRIREME_GRPC_TRANSPORT", "bogus")  # not a transport: ignored
    assert parse_args([]).grpc.transport == "h2"
    monkeypatch.setenv("TRIREME_GRPC_TRANSPORT", "grpcio")
    assert parse_args([]).grpc.transport == "grpcio"
    monkeypatch.delenv("TRIREME_GRPC_TRANSPORT")
    assert parse_args(["--grpc-transport", "grpcio"]).grpc.transport == "grpcio"


@pytest.mark.skipif(not HAVE_NATIVE, reason="pygrpc-native is not installed (trireme[grpc-native])")
def test_native_from_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIREME_GRPC_TRANSPORT", raising=False)
    assert parse_args(["--grpc-transport=native"]).grpc.transport == "native"
    monkeypatch.setenv("TRIREME_GRPC_TRANSPORT", "native")
    assert parse_args([]).grpc.transport == "native"
    assert parse_args(["--grpc-transport", "grpcio"]).grpc.transport == "grpcio"  # the flag wins
    with pytest.raises(SystemExit, match=r"native \(from \$TRIREME_GRPC_TRANSPORT\) cannot serve --grpc-use-ssl"):
        parse_args(["--grpc-use-ssl=true"])


@pytest.mark.skipif(not HAVE_NATIVE, reason="pygrpc-native is not installed (trireme[grpc-native])")
def test_native_refuses_every_flag_it_cannot_honour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIREME_GRPC_TRANSPORT", raising=False)
    flags = AGE_AND_PING_FLAGS
    with pytest.raises(SystemExit) as e:
        parse_args(["--grpc-transport=native", "--grpc-use-ssl-mutual=true", *flags])
    message = str(e.value)
    assert "--grpc-transport=native cannot serve --grpc-use-ssl-mutual" in message
    assert all(f.split("=")[0] in message for f in flags)
    # what it does honour starts
    config = parse_args(["--grpc-transport=native", "--grpc-keepalive-time=1000", "--grpc-keepalive-timeout=500"])
    assert config.grpc.channel_args["grpc.keepalive_time_ms"] == 1000


def test_unknown_transport_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--grpc-transport=h2o"])


@pytest.mark.skipif(importlib.util.find_spec("hpack") is None, reason="hpack is not installed (trireme[grpc-h2])")
def test_h2_takes_every_grpc_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """The h2 transport serves TLS, compression, ping limits, connection age and port reuse: nothing is refused."""
    monkeypatch.delenv("TRIREME_GRPC_TRANSPORT", raising=False)
    flags = [
        *AGE_AND_PING_FLAGS,
        "--grpc-infer-response-compression-level=low",
        "--reuse-grpc-port=true",
    ]
    config = parse_args(["--grpc-transport=h2", *flags])
    assert config.grpc.transport == "h2"
    assert config.grpc.channel_args["grpc.http2.max_ping_strikes"] == 0
