"""100 MiB requests do not hold up other clients: small requests keep being answered while they stream."""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess

BIG = 100 << 20  # bytes per large request (FP32)


def _small_loop(url: str, stop: threading.Event, latencies: list[float], errors: list[Any]) -> None:
    client = grpcclient.InferenceServerClient(url)
    x = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    x.set_data_from_numpy(data)
    try:
        while not stop.is_set():
            t0 = time.monotonic()
            out = client.infer("identity_fp32", [x]).as_numpy("OUTPUT0")
            latencies.append(time.monotonic() - t0)
            if not np.array_equal(out, data):
                errors.append(out)
    except Exception as e:  # reported by the test
        errors.append(e)
    finally:
        client.close()


@pytest.mark.slow
def test_small_requests_are_answered_while_100_mib_requests_stream(example_server: ServerProcess) -> None:
    big_client = grpcclient.InferenceServerClient(example_server.url)
    big = np.random.default_rng(1).random((1, BIG // 4), dtype=np.float32)
    inp = grpcclient.InferInput("INPUT0", list(big.shape), "FP32")
    inp.set_data_from_numpy(big)
    big_client.infer("identity_fp32_any", [inp])  # warm-up (arena growth, first-touch of buffers)

    stop = threading.Event()
    latencies: list[float] = []
    errors: list[Any] = []
    small = threading.Thread(target=_small_loop, args=(example_server.url, stop, latencies, errors))
    small.start()
    durations = []
    try:
        for _ in range(2):
            t0 = time.monotonic()
            out = big_client.infer("identity_fp32_any", [inp]).as_numpy("OUTPUT0")
            durations.append(time.monotonic() - t0)
            assert out.shape == big.shape and out[0, ::1_000_003].tolist() == big[0, ::1_000_003].tolist()
            assert np.array_equal(out, big)
    finally:
        stop.set()
        small.join(60)
        big_client.close()
    assert not errors
    # while two 100 MiB round trips went by, the small client kept getting answers, and a typical small
    # request took a fraction of one large round trip (generous: this is not a timing benchmark)
    assert len(latencies) >= 10, (len(latencies), durations)
    assert statistics.median(latencies) < 0.5 * statistics.mean(durations), (statistics.median(latencies), durations)
