"""PyTorch (TorchScript) backend through a real server and tritonclient: the seed fc_model_pt, dynamic batching."""

from __future__ import annotations

import queue
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tritonclient.grpc as grpcclient  # noqa: E402

from tests.conftest import ROOT, ServerProcess  # noqa: E402

pytestmark = pytest.mark.single_pass

BATCHING = "dynamic_batching { preferred_batch_size: [ 7 ] max_queue_delay_microseconds: 5000000 }\n"


def make_fc_repo(repo: Path, name: str = "fc_model_pt", extra_config: str = "") -> Path:
    """Run tools/make_example_models.py into `repo`; optionally copy the model under another name/config."""
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "make_example_models.py"), "--repository", str(repo)],
        check=True,
        capture_output=True,
    )
    if name == "fc_model_pt" and not extra_config:
        return repo / "fc_model_pt"
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.pt").write_bytes((repo / "fc_model_pt" / "1" / "model.pt").read_bytes())
    text = (repo / "fc_model_pt" / "config.pbtxt").read_text().replace('"fc_model_pt"', f'"{name}"')
    (model_dir / "config.pbtxt").write_text(text + extra_config)
    return model_dir


def fc_input(x: np.ndarray) -> grpcclient.InferInput:
    t = grpcclient.InferInput("input__0", list(x.shape), "INT64")
    t.set_data_from_numpy(x)
    return t


def direct(model_pt: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run the TorchScript module directly in torch (the reference)."""
    with warnings.catch_warnings():  # TorchScript is deprecated upstream; Triton's pytorch_libtorch is TorchScript
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(model_pt))
    with torch.no_grad():
        a, b = module(torch.from_numpy(x))
    return a.numpy(), b.numpy()


def test_fc_model_pt_matches_torch(start_server: Any, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    model_dir = make_fc_repo(repo)
    server: ServerProcess = start_server(repos=[repo])
    client = grpcclient.InferenceServerClient(server.url)
    try:
        x = np.array([[1, 2, 3], [4, 5, 99]], dtype=np.int64)
        result = client.infer("fc_model_pt", [fc_input(x)])
        out0, out1 = result.as_numpy("output__0"), result.as_numpy("output__1")
        assert out0.shape == (2, 3, 4) and out1.shape == (2, 3, 8)
        assert out0.dtype == np.float32 and out1.dtype == np.float32
        ref0, ref1 = direct(model_dir / "1" / "model.pt", x)
        np.testing.assert_allclose(out0, ref0, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out1, ref1, rtol=1e-6, atol=1e-6)
        # one requested output only
        only = client.infer("fc_model_pt", [fc_input(x)], outputs=[grpcclient.InferRequestedOutput("output__1")])
        assert only.as_numpy("output__0") is None
        np.testing.assert_allclose(only.as_numpy("output__1"), ref1, rtol=1e-6, atol=1e-6)
        config = client.get_model_config("fc_model_pt", as_json=True)["config"]
        assert config["platform"] == "pytorch_libtorch" and config["backend"] == "pytorch"
        assert config["default_model_filename"] == "model.pt"
    finally:
        client.close()


def test_dynamic_batching_concatenates_and_splits(start_server: Any, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    model_dir = make_fc_repo(repo, "fc_batched", BATCHING)
    server: ServerProcess = start_server(repos=[repo])
    client = grpcclient.InferenceServerClient(server.url)
    try:
        rng = np.random.default_rng(1)
        rows = [1, 2, 1, 3]  # 7 rows = the preferred batch size: one batch, one forward call
        xs = [rng.integers(0, 100, (n, 5), dtype=np.int64) for n in rows]
        done: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
        for i, x in enumerate(xs):
            client.async_infer(
                "fc_batched",
                [fc_input(x)],
                callback=lambda result, error, i=i: done.put((i, result, error)),
                request_id=f"r{i}",
            )
        results: list[Any] = [None] * len(xs)
        for _ in xs:
            i, result, error = done.get(timeout=30)
            assert error is None, error
            results[i] = result
        for i, x in enumerate(xs):
            ref0, ref1 = direct(model_dir / "1" / "model.pt", x)
            assert results[i].get_response().id == f"r{i}"
            np.testing.assert_allclose(results[i].as_numpy("output__0"), ref0, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(results[i].as_numpy("output__1"), ref1, rtol=1e-5, atol=1e-6)
        (stats,) = client.get_inference_statistics("fc_batched").model_stats
        assert stats.inference_count == 7
        assert stats.execution_count == 1
        assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(7, 1)]
    finally:
        client.close()


def test_missing_model_pt_fails_load_clearly(start_server: Any, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_fc_repo(repo)
    missing = repo / "no_file"
    (missing / "1").mkdir(parents=True)
    (missing / "config.pbtxt").write_text(
        (repo / "fc_model_pt" / "config.pbtxt").read_text().replace('"fc_model_pt"', '"no_file"')
    )
    server: ServerProcess = start_server(repos=[repo], args=["--exit-on-error=false"])
    client = grpcclient.InferenceServerClient(server.url)
    try:
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert index["no_file"].state == "UNAVAILABLE"
        assert "unable to load model 'no_file'" in index["no_file"].reason
        assert "model.pt" in index["no_file"].reason
        assert client.is_model_ready("fc_model_pt")
    finally:
        client.close()
    # with the default --exit-on-error=true the same repository stops the server
    strict: ServerProcess = start_server(repos=[repo], wait=False)
    assert strict.proc.wait(60) != 0
    assert "no_file" in strict.log()
