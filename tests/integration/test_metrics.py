"""The metrics endpoint through a real server: Triton's counters, histograms and gauges match the traffic sent."""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, copy_example, running_server, write_model
from tests.integration.metrics_scrape import scrape
from tests.integration.models import elementwise_py

HOLD_MODEL = elementwise_py(inp="IN", out="OUT", setup="time.sleep(0.3)")

STREAM_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for _ in range(3):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def _config(name: str, extra: str, batch: int = 8) -> str:
    return f"""
    name: "{name}"
    backend: "python"
    max_batch_size: {batch}
    input {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }}
    output {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }}
    {extra}
    """


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    copy_example(repo, "raise_error")
    # a long queue delay: requests sent together wait in the queue (pending) and run as one batch
    write_model(repo, "batched", _config("batched", "dynamic_batching { max_queue_delay_microseconds: 1500000 }"),
                HOLD_MODEL)  # fmt: skip
    write_model(repo, "stream", _config("stream", "model_transaction_policy { decoupled: true }", 0), STREAM_MODEL)
    timeout_policy = "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 50000 }"
    write_model(repo, "timeouts", _config("timeouts", f"dynamic_batching {{ {timeout_policy} }}", 1), HOLD_MODEL)
    args = ["--metrics-config", "summary_latencies=true", "--metrics-config", "histogram_latencies=true"]
    with running_server([repo], tmp_path_factory.mktemp("log") / "server.log", args) as srv:
        yield srv


def _fp32(name: str, data: np.ndarray) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(data.shape), "FP32")
    t.set_data_from_numpy(data)
    return t


def test_banner_and_http_rules(server: ServerProcess) -> None:
    assert f"Started Metrics Service at 127.0.0.1:{server.metrics_port}" in server.log()
    base = f"http://127.0.0.1:{server.metrics_port}"
    with urllib.request.urlopen(base + "/metrics/", timeout=10) as r:
        assert b"# TYPE nv_inference_request_success counter" in r.read()
    with urllib.request.urlopen(base + "/other", timeout=10) as r:  # Triton: 200 with an empty body
        assert r.status == 200 and r.read() == b""
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(base + "/metrics", data=b"", method="POST"), timeout=10)
    assert e.value.code == 405
    e.value.close()


def test_success_failure_and_durations_match_the_traffic(
    server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    labels = {"model": "raise_error", "version": "1"}
    before = scrape(server.metrics_url)
    assert before.value("nv_inference_request_success", **labels) == 0
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):  # every reason exists from load, at 0
        assert before.value("nv_inference_request_failure", reason=reason, **labels) == 0
    assert before.value("nv_model_load_duration_secs", **labels) > 0

    client.infer("raise_error", [_fp32("INPUT0", np.ones((1, 3), np.float32))])
    client.infer("raise_error", [_fp32("INPUT0", np.ones((2, 3), np.float32))])
    with pytest.raises(InferenceServerException, match="negative input is not allowed"):  # execute raises
        client.infer("raise_error", [_fp32("INPUT0", -np.ones((1, 3), np.float32))])
    with pytest.raises(InferenceServerException, match="input contains NaN"):  # model returns a TritonError
        client.infer("raise_error", [_fp32("INPUT0", np.full((1, 3), np.nan, np.float32))])

    # As in Triton (measured on 2.51): an error response the model returns is a success for the counters; only
    # an exception from execute fails the request, and nv_inference_count leaves out the failed ones.
    m = scrape(server.metrics_url)
    assert m.value("nv_inference_request_success", **labels) == 3
    assert m.value("nv_inference_request_failure", reason="BACKEND", **labels) == 1
    for reason in ("REJECTED", "CANCELED", "OTHER"):
        assert m.value("nv_inference_request_failure", reason=reason, **labels) == 0
    assert m.value("nv_inference_exec_count", **labels) == 4
    assert m.value("nv_inference_count", **labels) == 4  # batch sizes 1 + 2 + 1 (the raising one left out)
    assert m.value("nv_inference_pending_request_count", **labels) == 0
    assert m.value("trireme_queue_depth", **labels) == 0

    # the metrics are the statistics extension's counters, in microseconds
    stats = client.get_inference_statistics("raise_error").model_stats[0].inference_stats
    assert (stats.success.count, stats.fail.count) == (3, 1)
    assert (stats.queue.count, stats.compute_infer.count) == (3, 3)
    model_stats = client.get_inference_statistics("raise_error").model_stats[0]
    assert (model_stats.inference_count, model_stats.execution_count) == (4, 4)
    assert {b.batch_size: b.compute_infer.count for b in model_stats.batch_stats} == {1: 3, 2: 1}
    assert m.value("nv_inference_request_duration_us", **labels) == stats.success.ns // 1000
    assert m.value("nv_inference_queue_duration_us", **labels) == stats.queue.ns // 1000
    assert m.value("nv_inference_compute_infer_duration_us", **labels) == stats.compute_infer.ns // 1000

    # histograms: one observation per successful request, cumulative buckets, sums in seconds
    assert m.value("trireme_request_duration_seconds_count", **labels) == 3
    assert m.value("trireme_request_duration_seconds_bucket", le="+Inf", **labels) == 3
    assert m.value("trireme_request_duration_seconds_sum", **labels) == pytest.approx(stats.success.ns / 1e9)
    assert m.value("trireme_request_duration_seconds_bucket", le="60", **labels) == 3
    assert m.value("trireme_request_duration_seconds_bucket", le="0.0001", **labels) == 0  # nothing is that fast
    assert m.value("trireme_queue_duration_seconds_count", **labels) == 3
    assert m.value("trireme_compute_duration_seconds_count", **labels) == 3
    # Triton's summaries (enabled for this server): counts and sums are the counters', quantiles are real
    assert m.value("nv_inference_request_summary_us_count", **labels) == 3
    assert m.value("nv_inference_request_summary_us_sum", **labels) == stats.success.ns // 1000
    p99 = m.value("nv_inference_request_summary_us", quantile="0.99", **labels)
    assert 0 < p99 <= stats.success.ns // 1000


def test_batched_counts_and_pending_gauge(server: ServerProcess, client: grpcclient.InferenceServerClient) -> None:
    labels = {"model": "batched", "version": "1"}
    done: list[Any] = []
    for rows in (1, 2, 1):
        data = _fp32("IN", np.ones((rows, 4), np.float32))
        client.async_infer("batched", [data], lambda result, error: done.append(error))
    # the requests wait out the queue delay together: the pending gauge shows them
    deadline = time.monotonic() + 1.2
    pending = 0.0
    while time.monotonic() < deadline and pending < 3:
        queued = scrape(server.metrics_url)
        pending = queued.value("nv_inference_pending_request_count", **labels)
    assert pending == 3
    assert queued.value("trireme_queue_depth", **labels) == 3  # queued, none executing yet
    while len(done) < 3 and time.monotonic() < deadline + 10:
        time.sleep(0.05)
    assert done == [None, None, None]
    m = scrape(server.metrics_url)
    assert m.value("nv_inference_exec_count", **labels) == 1  # one batch of three requests
    assert m.value("nv_inference_count", **labels) == 4
    assert m.value("nv_inference_request_success", **labels) == 3
    assert m.value("nv_inference_pending_request_count", **labels) == 0
    assert m.value("trireme_queue_duration_seconds_count", **labels) == 3
    # each request queued for about the 1.5 s delay
    assert m.value("trireme_queue_duration_seconds_bucket", le="1", **labels) == 0
    assert m.value("trireme_queue_duration_seconds_bucket", le="2.5", **labels) == 3


def test_http_requests_count_in_the_same_metrics(server: ServerProcess) -> None:
    import tritonclient.http as httpclient

    labels = {"model": "raise_error", "version": "1"}
    before = scrape(server.metrics_url).value("nv_inference_request_success", **labels)
    client = httpclient.InferenceServerClient(server.http_url)
    t = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    t.set_data_from_numpy(np.ones((1, 3), np.float32))
    client.infer("raise_error", [t])
    client.close()
    assert scrape(server.metrics_url).value("nv_inference_request_success", **labels) == before + 1


def test_failure_reasons_rejected_and_canceled(server: ServerProcess, client: grpcclient.InferenceServerClient) -> None:
    done: list[Any] = []
    data = _fp32("IN", np.ones((1, 4), np.float32))
    client.async_infer("timeouts", [data], lambda result, error: done.append(error))  # runs for 0.3 s
    time.sleep(0.1)
    with pytest.raises(InferenceServerException, match="Request timeout expired"):  # waits behind it: times out
        client.infer("timeouts", [data])
    call = client.async_infer("batched", [data], lambda result, error: done.append(error))  # waits out 1.5 s
    time.sleep(0.3)
    call.cancel()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = scrape(server.metrics_url)
        if m.value("nv_inference_request_failure", model="batched", version="1", reason="CANCELED") == 1:
            break
        time.sleep(0.1)
    timeouts = {"model": "timeouts", "version": "1"}
    assert m.value("nv_inference_request_failure", reason="REJECTED", **timeouts) == 1
    assert m.value("nv_inference_request_success", **timeouts) == 1
    assert m.value("nv_inference_request_failure", reason="CANCELED", model="batched", version="1") == 1
    for reason in ("BACKEND", "OTHER"):
        assert m.value("nv_inference_request_failure", reason=reason, model="batched", version="1") == 0


def test_first_response_histograms_for_decoupled_models(
    server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    labels = {"model": "stream", "version": "1"}
    responses: list[Any] = []
    client.start_stream(callback=lambda result, error: responses.append(error))
    try:
        for i in range(2):
            client.async_stream_infer("stream", [_fp32("IN", np.ones((4,), np.float32))], request_id=str(i))
        deadline = time.monotonic() + 10
        while len(responses) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        client.stop_stream()
    assert responses == [None] * 6
    m = scrape(server.metrics_url)
    assert m.value("trireme_first_response_duration_seconds_count", **labels) == 2
    assert m.value("nv_inference_first_response_histogram_ms_count", **labels) == 2
    assert m.value("nv_inference_first_response_histogram_ms_bucket", le="+Inf", **labels) == 2
    assert m.value("nv_inference_request_success", **labels) == 2
    # only decoupled models get first-response histograms
    assert "raise_error" not in str(m.families["trireme_first_response_duration_seconds"].samples)


def test_restarted_worker_is_counted(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    copy_example(repo, "identity_fp32")
    server = start_server([repo])
    labels = {"model": "identity_fp32", "version": "1"}
    assert scrape(server.metrics_url).value("trireme_instance_restarts_total", **labels) == 0
    (pid,) = server.worker_pids()
    os.kill(pid, signal.SIGKILL)
    client = grpcclient.InferenceServerClient(server.url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if set(server.worker_pids()) - {pid} and client.is_model_ready("identity_fp32"):
            break
        time.sleep(0.1)
    client.close()
    assert scrape(server.metrics_url).value("trireme_instance_restarts_total", **labels) == 1


def test_allow_metrics_false_closes_the_port(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    copy_example(repo, "identity_fp32")
    server = start_server([repo], ["--allow-metrics=false"])
    assert "Started Metrics Service" not in server.log()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", server.metrics_port)) != 0


def test_response_cache_counters(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "cached", _config("cached", "response_cache { enable: true }"), HOLD_MODEL)
    server = start_server([repo], ["--cache-config", "local,size=1048576"])
    client = grpcclient.InferenceServerClient(server.url)
    for _ in range(3):  # one miss, then two hits
        client.infer("cached", [_fp32("IN", np.ones((1, 4), np.float32))])
    client.close()
    labels = {"model": "cached", "version": "1"}
    m = scrape(server.metrics_url)
    assert m.value("nv_cache_num_misses_per_model", **labels) == 1
    assert m.value("nv_cache_num_hits_per_model", **labels) == 2
    assert m.value("nv_inference_exec_count", **labels) == 1  # hits never reach the model
    assert m.value("nv_inference_request_success", **labels) == 3
    assert m.value("nv_cache_hit_duration_per_model", **labels) >= 0


def test_busy_metrics_port_is_a_clear_start_error(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    copy_example(repo, "identity_fp32")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = start_server([repo], ["--metrics-port", str(port)], wait=False)
        assert server.proc.wait(60) == 1
    assert f"failed to start Metrics Service at 127.0.0.1:{port}" in server.log()
    assert "--allow-metrics=false" in server.log()
