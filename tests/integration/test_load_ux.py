"""trireme-perf for a first-time user: optional outputs checked before measuring, why a level is unstable,
plot points labelled with their concurrency."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from load.measure.profiler import LevelResult, Measurement, instability_reason
from load.report.plot import series_from_results
from tests.conftest import copy_example

ROOT = Path(__file__).resolve().parents[2]


def _m(rate: float, latency_us: float, n: int = 100) -> Measurement:
    return Measurement(int(n / rate * 1e9), np.full(n, int(latency_us * 1000), dtype=np.int64), 1, completed=n)


def _without_matplotlib(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import matplotlib` fails, whether or not it is installed."""
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError(\"No module named 'matplotlib'\")\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shim"), str(ROOT)])}


def test_plot_without_matplotlib_fails_before_measuring(tmp_path: Path, start_server) -> None:
    repo = tmp_path / "models"
    copy_example(repo, "identity_fp32")
    server = start_server([repo])
    png = tmp_path / "curve.png"
    cmd = [sys.executable, "-m", "load", "-m", "identity_fp32", "-u", server.url, "--no-progress", "--plot", str(png)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT, env=_without_matplotlib(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "matplotlib" in proc.stderr and "pip install 'trireme[plot]'" in proc.stderr
    assert proc.stdout == "" and not png.exists()
    client = grpcclient.InferenceServerClient(server.url)
    stats = client.get_inference_statistics("identity_fp32", as_json=True)
    client.close()
    assert int(stats["model_stats"][0].get("inference_count", 0)) == 0  # not one request was sent


def test_plot_command_without_matplotlib_names_the_extra(tmp_path: Path) -> None:
    data = tmp_path / "run.csv"
    data.write_text("Concurrency,Inferences/Second,p99 latency\n1,100,900\n")
    cmd = [sys.executable, "-m", "load", "plot", str(data), "-o", str(tmp_path / "x.png")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT, env=_without_matplotlib(tmp_path))
    assert proc.returncode == 1
    assert "pip install 'trireme[plot]'" in proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_instability_reason_names_the_measure_and_spread() -> None:
    assert instability_reason([_m(1000, 500), _m(1050, 510), _m(990, 505)], 0.2, None) == ""
    reason = instability_reason([_m(800, 500), _m(1000, 500), _m(1100, 500)], 0.2, None)
    assert reason == (
        "throughput varied 38 % (800-1100 infer/s) over the last 3 windows, more than the 20 % allowed (-s)"
    )
    both = instability_reason([_m(1000, 500), _m(2000, 900), _m(1000, 500)], 0.1, 99)
    assert both.startswith("throughput varied 100 % (1000-2000 infer/s) and p99 latency varied 80 % (500-900 usec)")
    empty = Measurement(10**9, np.empty(0, dtype=np.int64), 1)
    assert "no request" in instability_reason([_m(1000, 500), _m(1000, 500), empty], 0.1, None)


def test_plot_points_carry_their_level() -> None:
    results = [
        LevelResult("concurrency", 4, True, _m(2000, 900), [2000.0]),
        LevelResult("concurrency", 1, True, _m(1000, 500), [1000.0]),
    ]
    label, points = series_from_results("m", results)
    assert label == "m" and [p[2] for p in points] == ["c=1", "c=4"]
    _, rate_points = series_from_results("m", [LevelResult("request_rate", 500.0, True, _m(500, 400), [500.0])])
    assert rate_points[0][2] == "500/s"


def test_plot_draws_labelled_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from load.report.plot import plot_series

    out = tmp_path / "c.png"
    plot_series([("m", [(1000.0, 500.0, "c=1"), (2000.0, 900.0, "c=4")])], str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
