"""Cancellation: a client that cancels a call or a stream cancels its queued requests and flags running ones."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess
from tests.integration.test_stream_models import write_slow


@pytest.fixture
def slow_server(start_server: Any, tmp_path: Path) -> Iterator[tuple[ServerProcess, Path]]:
    """A server with slow_identity (one instance), and the model's execution log."""
    repo = tmp_path / "repo"
    log = tmp_path / "executions.log"
    write_slow(repo, log)
    yield start_server(repos=[repo]), log


def slow_inputs(value: int, delay_ms: int) -> list[grpcclient.InferInput]:
    """INPUT0 = [value], DELAY = [delay_ms]."""
    a = grpcclient.InferInput("INPUT0", [1], "INT32")
    a.set_data_from_numpy(np.array([value], dtype=np.int32))
    d = grpcclient.InferInput("DELAY", [1], "UINT32")
    d.set_data_from_numpy(np.array([delay_ms], dtype=np.uint32))
    return [a, d]


def executions(log: Path) -> list[str]:
    """Lines the model wrote, one per executed request."""
    return log.read_text().splitlines() if log.exists() else []


def wait_for(predicate: Any, timeout_s: float = 20.0) -> None:
    """Poll until predicate() is true."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


def stats(client: Any) -> Any:
    """slow_identity's ModelStatistics."""
    return client.get_inference_statistics("slow_identity").model_stats[0]


def test_closing_a_stream_cancels_queued_and_flags_running(slow_server: tuple[ServerProcess, Path]) -> None:
    server, log = slow_server
    client = grpcclient.InferenceServerClient(server.url)
    results: list[Any] = []
    try:
        client.start_stream(callback=lambda result, error: results.append((result, error)))
        for value in range(4):
            client.async_stream_infer("slow_identity", slow_inputs(value, 5000), request_id=str(value))
        time.sleep(0.3)  # request 0 runs (5 s unless cancelled), 1-3 wait in the queue
        client.stop_stream(cancel_requests=True)
        wait_for(lambda: len(executions(log)) == 1)
        assert executions(log) == ["0 cancelled=True"]  # the running request saw is_cancelled()
        wait_for(lambda: stats(client).execution_count == 1)
        time.sleep(0.5)  # the three queued requests would have started by now if they were still queued
        assert executions(log) == ["0 cancelled=True"]
        s = stats(client)
        assert s.execution_count == 1 and s.inference_count == 1
        assert s.inference_stats.fail.count == 3  # the cancelled, never executed ones
        # the server is still healthy and the model still answers
        out = client.infer("slow_identity", slow_inputs(7, 0)).as_numpy("OUTPUT0")
        assert out.tolist() == [7]
    finally:
        client.close()


def test_cancelling_unary_calls(slow_server: tuple[ServerProcess, Path]) -> None:
    server, log = slow_server
    client = grpcclient.InferenceServerClient(server.url)
    try:
        done: list[Any] = []
        running = client.async_infer(
            "slow_identity", slow_inputs(1, 5000), callback=lambda result, error: done.append(error)
        )
        time.sleep(0.3)
        queued = client.async_infer(
            "slow_identity", slow_inputs(2, 0), callback=lambda result, error: done.append(error)
        )
        time.sleep(0.3)
        queued.cancel()
        running.cancel()
        wait_for(lambda: len(done) == 2)
        assert all(e is not None and "CANCELLED" in e.status() for e in done)
        wait_for(lambda: stats(client).execution_count == 1)
        time.sleep(0.5)
        assert executions(log) == ["1 cancelled=True"]
        assert stats(client).inference_stats.fail.count == 1
    finally:
        client.close()
