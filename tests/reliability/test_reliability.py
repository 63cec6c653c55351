"""The reliability suite against Trireme: short in CI, full length with TRIREME_RELIABILITY=full (>= 1000 fuzz cases,
a one-minute soak). Every probe must end with no crash, hang, lost or wrong answer, and bounded memory."""

from __future__ import annotations

import os

import pytest

from tests.reliability import fuzz, hostile, probes
from tests.reliability.tally import Tally, Target, scaled

pytestmark = pytest.mark.reliability


def _record(summary: Tally, tally: Tally, target: Target | None) -> None:
    summary.add(tally)
    print(tally.line(os.environ.get("PYTEST_CURRENT_TEST", "probe").split("::")[-1].split(" ")[0]))
    assert tally.clean(), (tally.line("probe"), dict(tally.statuses), tally.examples)
    assert tally.statuses.get("UNKNOWN", 0) == 0, tally.examples  # what an exception escaping grpc becomes
    log = target.log.read_text(errors="replace") if target is not None and target.log else ""
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]


def test_fuzz_model_infer(target: Target, summary: Tally) -> None:
    _record(summary, fuzz.fuzz_infer(target, seed=20, count=scaled(60, 600)), target)


def test_fuzz_model_stream_infer(target: Target, summary: Tally) -> None:
    _record(summary, fuzz.fuzz_stream(target, seed=21, count=scaled(50, 300)), target)


def test_fuzz_shared_memory(target: Target, summary: Tally) -> None:
    _record(summary, fuzz.fuzz_shm(target, seed=22, count=scaled(30, 200)), target)


def test_fuzz_http_bodies(target: Target, summary: Tally) -> None:
    _record(summary, fuzz.fuzz_http(target, seed=23, count=scaled(40, 300)), target)


def test_hostile_clients(target: Target, summary: Tally) -> None:
    """Shrunk and unlinked shm regions, huge versions, deep JSON, decompression bombs, chunk floods."""
    _record(summary, hostile.fuzz_hostile(target, seed=24, rounds=scaled(1, 3)), target)


def test_big_messages(target: Target, summary: Tally) -> None:
    _record(summary, probes.big_messages(target, mib=scaled(16, 100)), target)


def test_idle_and_reset_connections(target: Target, summary: Tally) -> None:
    _record(summary, probes.idle_connections(target, count=scaled(30, 300)), target)


def test_unread_streams_are_bounded(target: Target, summary: Tally) -> None:
    tally = probes.unread_streams(
        target, cycles=scaled(2, 5), streams=scaled(2, 4), mib_each=scaled(10, 40), hold_s=scaled(1, 3)
    )
    _record(summary, tally, target)
    assert tally.rss_growth < 64 * 2**20, tally.line("unread streams")


def test_worker_kill_under_load(target: Target, summary: Tally) -> None:
    tally, recovery_s = probes.kill_under_load(target, seconds=scaled(4, 20))
    summary.add(tally)
    print(tally.line(f"worker kill (recovered in {recovery_s:.2f} s)"), dict(tally.statuses))
    assert tally.hangs == 0 and tally.wrong == 0 and tally.crashes == 0, tally.line("kill")
    assert tally.statuses["OK"] > tally.cases // 2
    assert 0 <= recovery_s < 10, recovery_s  # a replacement worker served `slow` again


def test_soak(target: Target, summary: Tally) -> None:
    tally = probes.soak(target, seconds=scaled(4, 60))
    _record(summary, tally, target)
    assert tally.rss_growth < 64 * 2**20, tally.line("soak")


def test_malformed_chunk_split_across_reads(target: Target, summary: Tally) -> None:
    """A body that stops parsing after its request's handler started is a 400 at once (aiohttp alone left that
    request waiting until the client went away: service/frontend/http/protocol.py)."""
    import random

    tally = Tally()
    hostile.split_malformed_chunk(target, tally, random.Random(25))
    _record(summary, tally, target)
    assert dict(tally.statuses) == {"http-400": 1}, tally.examples


def test_sigterm_drains_in_flight_requests(target: Target, summary: Tally) -> None:
    """Last: it stops the module's server (a fresh one when run alone)."""
    tally, status = probes.drain_on_sigterm(lambda: target)
    _record(summary, tally, target)
    assert status == 0
