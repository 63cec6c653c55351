"""trireme-perf pieces that need no server: ranges, stability, percentiles, CSV layout, payload encoding."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from load.cli import float_range, int_range
from load.measure.data import (
    ConfigError,
    ModelInfo,
    TensorInfo,
    check_batch_size,
    json_steps,
    parse_shape_options,
    resolve_dims,
    synthetic_steps,
)
from load.measure.modes import FLAG_SEQUENCE_END, RESPONSES_SHIFT
from load.measure.profiler import LevelResult, Measurement, ServerStats, is_stable, merge
from load.measure.session import levels_of
from load.measure.workers import share
from load.report.formats import csv_rows, network_misc_us, result_dict
from load.report.plot import PlotError, series_from_csv
from load.transports.client import InputTensor, build_infer_request, request_suffix
from protos import grpc_service_pb2 as pb
from shm.tensor import deserialize_bytes


def _m(rate: float, latency_us: float, n: int = 100, batch: int = 1) -> Measurement:
    """A window with `n` requests at `latency_us` whose duration gives `rate` infer/s."""
    duration = int(n * batch / rate * 1e9)
    return Measurement(duration, np.full(n, int(latency_us * 1000), dtype=np.int64), batch, completed=n)


def test_ranges_and_levels() -> None:
    assert int_range("4") == (4, 4, 1)
    assert levels_of(int_range("1:8:2")) == [1, 3, 5, 7]
    assert levels_of(float_range("100:300:100")) == [100.0, 200.0, 300.0]
    for bad in ("a", "4:1", "1:2:0", "1:2:3:4", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            int_range(bad)


def test_percentile_index_matches_perf_analyzer() -> None:
    m = Measurement(10**9, np.arange(1, 101, dtype=np.int64) * 1000, 1)
    # index = round(p/100 * (n-1)): p50 -> 50 (value 51), p99 -> 98 (value 99)
    assert m.percentile_ns(50) == 51_000
    assert m.percentile_ns(99) == 99_000
    assert m.infer_per_sec == pytest.approx(100.0)


def test_stability_rule() -> None:
    assert not is_stable([_m(1000, 500), _m(1000, 500)], 0.1, None)
    assert is_stable([_m(1000, 500), _m(1050, 520), _m(980, 510)], 0.1, None)
    assert not is_stable([_m(1000, 500), _m(1200, 500), _m(1000, 500)], 0.1, None)
    assert not is_stable([_m(1000, 500), _m(1000, 700), _m(1000, 500)], 0.1, None)
    empty = Measurement(10**9, np.empty(0, dtype=np.int64), 1)
    assert not is_stable([_m(1000, 500), _m(1000, 500), empty], 0.1, None)


def test_merge_pools_windows() -> None:
    merged = merge([_m(1000, 400, n=100), _m(500, 800, n=50), _m(1000, 400, n=100)])
    assert merged.request_count == 250
    assert merged.infer_per_sec == pytest.approx(250 / 0.3)
    assert merged.percentile_ns(50) == 400_000
    assert merged.completed == 250


def test_server_stats_delta_and_average() -> None:
    resp = pb.ModelStatisticsResponse()
    for version, count in (("1", 10), ("2", 5)):
        ms = resp.model_stats.add(name="m", version=version, inference_count=count, execution_count=count)
        ms.inference_stats.success.count = count
        ms.inference_stats.success.ns = count * 1000
        ms.inference_stats.queue.count = count
        ms.inference_stats.queue.ns = count * 200
    both = ServerStats.from_response(resp, "m")
    only2 = ServerStats.from_response(resp, "m", "2")
    assert both.count["success"] == 15 and only2.count["success"] == 5
    delta = both.combine(only2, -1)
    assert delta.inference_count == 10
    assert delta.avg_us("queue") == pytest.approx(0.2)


def test_csv_layout_is_perf_analyzers() -> None:
    a = LevelResult("concurrency", 1, True, _m(1000, 500), [1000.0])
    b = LevelResult("concurrency", 2, True, _m(1800, 900), [1800.0])
    a.merged.server = ServerStats()
    b.merged.server = ServerStats()
    rows = csv_rows([b, a], include_server=True)
    assert rows[0] == [
        "Concurrency",
        "Inferences/Second",
        "Client Send",
        "Network+Server Send/Recv",
        "Server Queue",
        "Server Compute Input",
        "Server Compute Infer",
        "Server Compute Output",
        "Client Recv",
        "p50 latency",
        "p90 latency",
        "p95 latency",
        "p99 latency",
    ]
    assert [r[0] for r in rows[1:]] == ["1", "2"]  # sorted by throughput, as perf_analyzer does
    assert rows[1][9:] == ["500", "500", "500", "500"]
    assert network_misc_us(a.merged) == pytest.approx(500.0)
    rate_rows = csv_rows([LevelResult("request_rate", 100.0, True, _m(100, 300), [100.0], percentile=97)], False)
    assert rate_rows[0][0] == "Request Rate" and "p97 latency" in rate_rows[0]
    doc = result_dict(a)
    assert doc["concurrency"] == 1 and doc["latency_us"]["p99"] == 500.0


def test_request_suffix_merges_into_preserialized_body() -> None:
    body = build_infer_request("m", "", [InputTensor("IN", "FP32", (1, 2), data=b"\0" * 8)]).SerializeToString()
    merged = pb.ModelInferRequest.FromString(body + request_suffix(request_id="7", sequence_id=42, sequence_start=True))
    assert merged.id == "7"
    assert merged.parameters["sequence_id"].int64_param == 42
    assert merged.parameters["sequence_start"].bool_param is True
    assert merged.parameters["sequence_end"].bool_param is False
    assert merged.raw_input_contents == [b"\0" * 8]


def test_shared_memory_request_parameters() -> None:
    req = build_infer_request("m", "1", [InputTensor("IN", "INT32", (1,), shm_region="IN_0_0", shm_byte_size=4)])
    params = req.inputs[0].parameters
    assert params["shared_memory_region"].string_param == "IN_0_0"
    assert params["shared_memory_byte_size"].int64_param == 4
    assert "shared_memory_offset" not in params
    assert len(req.raw_input_contents) == 0


def _info(max_batch_size: int = 8) -> ModelInfo:
    return ModelInfo(
        "m",
        "",
        max_batch_size,
        [TensorInfo("A", "FP32", (4,)), TensorInfo("V", "INT32", (-1, 2)), TensorInfo("S", "BYTES", (1,))],
        [TensorInfo("OUT", "FP32", (4,))],
    )


def test_shapes_and_batch_validation() -> None:
    info = _info()
    assert parse_shape_options(["V:3,2"]) == {"V": (3, 2)}
    dims = resolve_dims(info, {"V": (3, 2)})
    assert dims == {"A": (4,), "V": (3, 2), "S": (1,)}
    with pytest.raises(ConfigError, match="not an input"):
        resolve_dims(info, {"X": (1,)})
    with pytest.raises(ConfigError, match="does not fit"):
        resolve_dims(info, {"A": (5,)})
    with pytest.raises(ConfigError, match="variable dims"):
        synthetic_steps(info, resolve_dims(info, {}), "random")
    for bad in ("V", "V:", "V:a", ":1"):
        with pytest.raises(ConfigError):
            parse_shape_options([bad])
    check_batch_size(info, 8)
    with pytest.raises(ConfigError, match="larger than max_batch_size"):
        check_batch_size(info, 9)
    with pytest.raises(ConfigError, match="does not support batching"):
        check_batch_size(_info(0), 2)


def test_synthetic_data_sizes() -> None:
    info = _info()
    (step,) = synthetic_steps(info, resolve_dims(info, {"V": (3, 2)}), "zero", string_length=5)[0]
    assert step["A"] == ((4,), bytes(16))
    assert step["V"][1] == bytes(24)
    assert deserialize_bytes(step["S"][1]) == [b"00000"]


def test_json_input_data(tmp_path: Path) -> None:
    info = _info()
    doc = {
        "data": [
            [
                {"A": [1, 2, 3, 4], "V": {"content": [1, 2, 3, 4], "shape": [2, 2]}, "S": ["hi"]},
                {"A": [[0, 0, 0, 1]], "V": {"content": [5, 6], "shape": [1, 2]}, "S": ["x"]},
            ],
            [{"A": [9, 9, 9, 9], "V": {"content": [7, 8], "shape": [1, 2]}, "S": ["y"]}],
        ]
    }
    path = tmp_path / "data.json"
    path.write_text(json.dumps(doc))
    streams = json_steps(info, resolve_dims(info, {}), str(path))
    assert [len(s) for s in streams] == [2, 1]
    assert np.frombuffer(streams[0][0]["A"][1], dtype="<f4").tolist() == [1, 2, 3, 4]
    assert streams[0][0]["V"][0] == (2, 2)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [{"A": [1, 2, 3]}]}))
    with pytest.raises(ConfigError):
        json_steps(info, resolve_dims(info, {}), str(bad))
    with pytest.raises(ConfigError, match="cannot read"):
        json_steps(info, {}, str(tmp_path / "missing.json"))


def test_worker_shares() -> None:
    assert [share(5, "concurrency", i, 2) for i in range(2)] == [3.0, 2.0]
    assert sum(share(7, "concurrency", i, 3) for i in range(3)) == 7
    assert share(300.0, "request_rate", 1, 3) == pytest.approx(100.0)


def test_record_flags_layout() -> None:
    flags = FLAG_SEQUENCE_END | 3 << RESPONSES_SHIFT
    assert flags & FLAG_SEQUENCE_END and flags >> RESPONSES_SHIFT == 3


def test_plot_reads_perf_analyzer_csv(tmp_path: Path) -> None:
    path = tmp_path / "pa.csv"
    path.write_text(
        "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
        "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
        "4,4008.35,2,284,477,13,131,83,1,948,1348,1495,2360\n1,2063.83,2,189,42,14,138,91,1,461,557,604,888\n"
    )
    label, points = series_from_csv(str(path), "p99")
    assert label == "pa" and points == [(2063.83, 888.0, "c=1"), (4008.35, 2360.0, "c=4")]
    with pytest.raises(PlotError, match="avg needs --verbose-csv"):
        series_from_csv(str(path), "avg")
