"""Security and connection flags: restricted-API rules, keepalive flags as grpc core arguments, TLS settings."""

from __future__ import annotations

import argparse

import pytest

from service.config.access import RestrictedApi, parse_restricted
from service.config.flags import parse_args


def test_restricted_rule_parses_groups_key_and_value() -> None:
    rule = parse_restricted("shared-memory, model-repository:Admin-Key=s3:cr=t")
    assert rule == RestrictedApi(frozenset({"shared-memory", "model-repository"}), "admin-key", "s3:cr=t")


@pytest.mark.parametrize("text", ["health", "health:key", ":key=value", "health:=value", "healthz:key=value"])
def test_malformed_restricted_rules_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_restricted(text)


def test_a_group_restricted_twice_stops_the_server() -> None:
    with pytest.raises(SystemExit, match="health"):
        parse_args(["--grpc-restricted-protocol=health:a=1", "--grpc-restricted-protocol=metadata,health:b=2"])


def test_keepalive_flags_become_grpc_core_arguments() -> None:
    config = parse_args(
        [
            "--grpc-keepalive-time=1000",
            "--grpc-keepalive-timeout=500",
            "--grpc-keepalive-permit-without-calls=true",
            "--grpc-http2-max-pings-without-data=0",
            "--grpc-http2-min-recv-ping-interval-without-data=100",
            "--grpc-http2-max-ping-strikes=3",
            "--grpc-max-connection-age=60000",
            "--grpc-max-connection-age-grace=5000",
        ]
    )
    assert config.grpc.channel_args == {
        "grpc.keepalive_time_ms": 1000,
        "grpc.keepalive_timeout_ms": 500,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": 0,
        "grpc.http2.min_ping_interval_without_data_ms": 100,
        "grpc.http2.max_ping_strikes": 3,
        "grpc.max_connection_age_ms": 60000,
        "grpc.max_connection_age_grace_ms": 5000,
    }
    assert parse_args([]).grpc.channel_args == {}  # unset: grpc's defaults, which are Triton's


def test_mutual_tls_implies_tls_and_admission_bounds_parse() -> None:
    config = parse_args(["--grpc-use-ssl-mutual=true", "--max-inflight-requests=64", "--http-use-ssl-mutual=1"])
    assert config.grpc.tls.use_ssl and config.grpc.tls.use_ssl_mutual
    assert config.http_tls.use_ssl and config.http_tls.use_ssl_mutual
    assert config.max_inflight_requests == 64 and config.max_inflight_requests_per_model == 0
