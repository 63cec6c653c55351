"""trireme-perf against a live server: every load mode, CSV/JSON consistency, clear errors, no leftovers.

The server is Trireme when `python -m service` serves, else the real Triton (see load/servers.py);
set SERVER_KIND below (or TRIREME_LOAD_SERVER) to force one. Tests skip when neither is available.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from load.servers import ServerHandle, free_port, start_preferred, start_server, write_model_repo
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

SERVER_KIND: str | None = None  # None: Trireme if it serves, else Triton; or "trireme" / "triton"
ROOT = Path(__file__).resolve().parents[2]
FAST = ["-p", "500", "-s", "50", "-r", "8", "--allow-unstable", "--no-progress"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    root = tmp_path_factory.mktemp("load-server")
    repo = write_model_repo(root / "models")
    try:
        handle = start_server(SERVER_KIND, repo, root) if SERVER_KIND else start_preferred(repo, root)
    except RuntimeError as err:
        pytest.skip(f"no Triton-compatible server to load: {err}")
    yield handle
    handle.stop()


def perf(url: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "load", "-u", url, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def run_ok(server: ServerHandle, tmp_path: Path, *args: str) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Run with -f and --json; assert success; return the JSON summary and the CSV rows."""
    csv_path, json_path = tmp_path / "out.csv", tmp_path / "out.json"
    proc = perf(server.url, *FAST, "-f", str(csv_path), "--json", str(json_path), *args)
    assert proc.returncode == 0, proc.stderr + proc.stdout + server.log_tail()
    assert "Traceback" not in proc.stderr
    with csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    return json.loads(json_path.read_text()), rows


def check_consistent(doc: dict[str, Any], rows: list[dict[str, str]], levels: list[float], batch: int = 1) -> None:
    """Counts, rates and percentiles agree between JSON and CSV and make sense."""
    mode = doc["settings"]["mode"]
    key, column = ("concurrency", "Concurrency") if mode == "concurrency" else ("request_rate", "Request Rate")
    results = doc["results"]
    assert [r[key] for r in results] == levels
    assert sorted(float(r[column]) for r in rows) == sorted(levels)
    by_level = {float(r[column]): r for r in rows}
    for r in results:
        assert r["request_count"] > 0
        assert r["infer_per_sec"] == pytest.approx(r["request_count"] * batch / r["duration_s"], rel=1e-6)
        lat = r["latency_us"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"]
        row = by_level[float(r[key])]
        assert float(row["Inferences/Second"]) == pytest.approx(r["infer_per_sec"], rel=1e-4)
        pcts = [int(row[f"p{p} latency"]) for p in (50, 90, 95, 99)]
        assert pcts == sorted(pcts)
        assert pcts[-1] == int(lat["p99"])
        srv = r["server"]
        if srv is not None:  # server counts by its clock, the client by its own: close, not equal
            assert abs(srv["success_count"] - r["request_count"]) <= 0.1 * r["request_count"] + 20
            assert srv["inference_count"] >= srv["success_count"]


@pytest.mark.parametrize("transport", ["h2", "grpc"])
def test_concurrency_sweep(server: ServerHandle, tmp_path: Path, transport: str) -> None:
    doc, rows = run_ok(
        server, tmp_path, "-m", "identity_fp32", "--concurrency-range", "1:3:2", "--transport", transport
    )
    check_consistent(doc, rows, [1, 3])
    assert doc["settings"]["processes"] == 1 and doc["settings"]["transport"] == transport
    assert list(rows[0])[:3] == ["Concurrency", "Inferences/Second", "Client Send"]
    assert all(r["client"]["cpu_us_per_request"] > 0 for r in doc["results"])


def test_grpc_async_callbacks(server: ServerHandle, tmp_path: Path) -> None:
    doc, rows = run_ok(server, tmp_path, "-m", "identity_fp32", "--transport", "grpc", "-a", "--concurrency-range", "4")
    check_consistent(doc, rows, [4])


def test_large_tensors(server: ServerHandle, tmp_path: Path) -> None:
    """300 kB BYTES elements: several HTTP/2 frames and window updates per request and response."""
    args = ("-m", "identity_bytes", "--string-length", "300000", "--concurrency-range", "2")
    doc, rows = run_ok(server, tmp_path, *args)
    check_consistent(doc, rows, [2])
    assert doc["settings"]["request_bytes"] > 300_000


def test_worker_processes(server: ServerHandle, tmp_path: Path) -> None:
    doc, rows = run_ok(server, tmp_path, "-m", "add_sub", "--processes", "2", "--concurrency-range", "2")
    check_consistent(doc, rows, [2])
    assert doc["settings"]["processes"] == 2


@pytest.mark.parametrize(("distribution", "transport"), [("constant", "h2"), ("poisson", "h2"), ("poisson", "grpc")])
def test_request_rate(server: ServerHandle, tmp_path: Path, distribution: str, transport: str) -> None:
    doc, rows = run_ok(
        server,
        tmp_path,
        *("-m", "identity_fp32", "--request-rate-range", "100:200:100", "--transport", transport),
        *("--request-distribution", distribution),
    )
    check_consistent(doc, rows, [100.0, 200.0])
    for r in doc["results"]:
        assert r["infer_per_sec"] == pytest.approx(r["request_rate"], rel=0.3)
        assert r["send_rate"] == pytest.approx(r["request_rate"], rel=0.3)


def test_streaming(server: ServerHandle, tmp_path: Path) -> None:
    doc, rows = run_ok(server, tmp_path, "-m", "identity_fp32", "--streaming", "--concurrency-range", "2")
    check_consistent(doc, rows, [2])
    assert doc["settings"]["streaming"] is True


def test_streaming_request_rate(server: ServerHandle, tmp_path: Path) -> None:
    doc, rows = run_ok(server, tmp_path, "-m", "identity_fp32", "--streaming", "--request-rate-range", "150")
    check_consistent(doc, rows, [150.0])


def test_decoupled_streaming_counts_every_response(server: ServerHandle, tmp_path: Path) -> None:
    doc, _rows = run_ok(server, tmp_path, "-m", "repeat_decoupled", "--streaming", "--concurrency-range", "2")
    (r,) = doc["results"]
    assert r["request_count"] > 0 and r["response_count"] == 2 * r["request_count"]


def test_sequences(server: ServerHandle, tmp_path: Path) -> None:
    doc, rows = run_ok(
        server,
        tmp_path,
        *("-m", "sequence_accumulate", "--concurrency-range", "2"),
        *("--sequence-length", "4", "--sequence-length-variation", "0", "--sequence-id-range", "100:200"),
    )
    check_consistent(doc, rows, [2])
    (r,) = doc["results"]
    assert doc["settings"]["sequence"]["length"] == 4
    assert r["sequence_count"] > 0
    assert abs(r["request_count"] - 4 * r["sequence_count"]) <= 4 * 2 * 2


def test_sequences_request_rate_streaming(server: ServerHandle, tmp_path: Path) -> None:
    doc, rows = run_ok(
        server,
        tmp_path,
        *("-m", "sequence_accumulate", "--streaming", "--request-rate-range", "100"),
        *("--sequence-length", "3", "--num-of-sequences", "2"),
    )
    check_consistent(doc, rows, [100.0])
    assert doc["results"][0]["sequence_count"] > 0


def _status(url: str) -> dict[str, Any]:
    with grpc.insecure_channel(url) as ch:
        resp = pb_grpc.GRPCInferenceServiceStub(ch).SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest())
    return dict(resp.regions)


@pytest.mark.usefixtures("machine_wide_shm_names")  # perf_analyzer's segment names, machine-wide (conftest.py)
def test_system_shared_memory(server: ServerHandle, tmp_path: Path) -> None:
    doc, rows = run_ok(server, tmp_path, "-m", "identity_fp32", "--shared-memory", "system", "--concurrency-range", "2")
    check_consistent(doc, rows, [2])
    assert doc["settings"]["shared_memory"] == "system"
    for name in ("INPUT0_0_0", "OUTPUT0"):  # perf_analyzer's region names; removed afterwards
        assert not Path("/dev/shm", name).exists()
    assert not {"INPUT0_0_0", "OUTPUT0"} & set(_status(server.url))


def test_batch_and_json_data(server: ServerHandle, tmp_path: Path) -> None:
    data = tmp_path / "data.json"
    steps = [{"INPUT0": [1, 2, 3, 4], "INPUT1": [4, 3, 2, 1]}, {"INPUT0": [0, 0, 0, 0], "INPUT1": [1, 1, 1, 1]}]
    data.write_text(json.dumps({"data": steps}))
    doc, rows = run_ok(server, tmp_path, "-m", "add_sub", "-b", "4", "--input-data", str(data))
    check_consistent(doc, rows, [1], batch=4)


def test_bytes_and_percentile(server: ServerHandle, tmp_path: Path) -> None:
    doc, rows = run_ok(server, tmp_path, "-m", "identity_bytes", "--string-length", "16", "--percentile", "95")
    check_consistent(doc, rows, [1])
    assert doc["settings"]["percentile"] == 95
    assert list(rows[0]).count("p95 latency") == 1


def test_latency_threshold_stops_the_sweep(server: ServerHandle, tmp_path: Path) -> None:
    proc = perf(server.url, *FAST, "-m", "identity_fp32", "-l", "0.001", "--concurrency-range", "1:3")
    assert proc.returncode == 0, proc.stderr
    assert "went over the set limit" in proc.stderr
    assert "Request concurrency: 2" not in proc.stdout


def test_plot(server: ServerHandle, tmp_path: Path) -> None:
    out = tmp_path / "curve.png"
    proc = perf(server.url, *FAST, "-m", "identity_fp32", "--concurrency-range", "1:2", "--plot", str(out))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert proc.returncode == 1 and "needs matplotlib" in proc.stderr
        assert "Traceback" not in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert out.stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["-m", "no_such_model"], 2, "is not available"),
        (["-m", "identity_fp32", "--shape", "INPUT0:3"], 2, "does not fit"),
        (["-m", "identity_fp32", "--shape", "NOPE:3"], 2, "not an input"),
        (["-m", "identity_fp32", "-b", "9"], 2, "larger than max_batch_size"),
        (["-m", "repeat_decoupled"], 2, "--streaming"),
        (["-m", "identity_fp32", "-i", "http"], 2, "HTTP is not supported"),
        (["-m", "identity_fp32", "--input-data", "/nonexistent.json"], 2, "cannot read input data"),
        (["-m", "always_fails"], 1, "refuses on purpose"),
    ],
)
def test_clear_errors(server: ServerHandle, args: list[str], code: int, message: str) -> None:
    proc = perf(server.url, *FAST, *args)
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_server_down() -> None:
    proc = perf(f"127.0.0.1:{free_port()}", "-m", "identity_fp32", "--rpc-timeout", "3")
    assert proc.returncode == 1
    assert "cannot reach a server" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_arguments_exit_2() -> None:
    proc = perf("127.0.0.1:1", "-m", "x", "--concurrency-range", "4:1")
    assert proc.returncode == 2 and "start <= end" in proc.stderr
