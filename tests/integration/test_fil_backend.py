"""The fil backend through a real server, real workers and tritonclient: XGBoost (JSON, UBJ, `xgboost`), LightGBM
and scikit-learn forests as Treelite checkpoints, trained here on tiny data; every answer is compared with the
framework's own predict / predict_proba; bad configs fail only their own model's load, with a message naming it."""

from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

xgb = pytest.importorskip("xgboost", reason="the fil extra (xgboost) is not installed")
lgb = pytest.importorskip("lightgbm", reason="the fil extra (lightgbm) is not installed")
pytest.importorskip("treelite", reason="the fil extra (treelite) is not installed")
pytest.importorskip("sklearn", reason="scikit-learn is not installed")

import treelite.sklearn  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor  # noqa: E402

from tests.compat.test_perf_analyzer_stream import PERF_ANALYZER, perf  # noqa: E402
from tests.conftest import running_server  # noqa: E402

pytestmark = pytest.mark.single_pass

FEATURES = 6
CONFIG = """\
backend: "fil"
max_batch_size: 64
input [ {{ name: "{input}" data_type: {dtype} dims: [ {features} ] }} ]
output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ {out} ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
parameters [ {params} ]
{extra}
"""


def _quiet(save: Any, path: str) -> None:
    """XGBoost warns that a `.model` file gets its UBJSON format (what FIL's model_type `xgboost` names)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save(path)


def _params(**kv: str) -> str:
    return ", ".join(f'{{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in kv.items())


def _write(
    repo: Path,
    name: str,
    files: dict[str, Any],
    out: int = 1,
    input: str = "input__0",
    dtype: str = "TYPE_FP32",
    extra: str = "",
    **params: str,
) -> Path:
    """A model folder: config.pbtxt and version 1 with `files` (name -> callable(path) that writes it)."""
    version = repo / name / "1"
    version.mkdir(parents=True)
    for filename, save in files.items():
        save(str(version / filename))
    text = CONFIG.format(input=input, dtype=dtype, features=FEATURES, out=out, params=_params(**params), extra=extra)
    (repo / name / "config.pbtxt").write_text(text)
    return version


@pytest.fixture(scope="module")
def fil(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One server over every model; yields (server, references) where references[name](x) is the expected answer."""
    tmp = tmp_path_factory.mktemp("fil")
    repo = tmp / "repo"
    rng = np.random.default_rng(7)
    x = rng.random((300, FEATURES), dtype=np.float32)
    y_bin = (x[:, 0] + x[:, 1] > 1).astype(int)
    y_multi = (x[:, 2] * 3).astype(int)
    y_reg = x[:, 0] * 2 - x[:, 3]
    refs: dict[str, Any] = {}

    xb = xgb.XGBClassifier(n_estimators=20, max_depth=3).fit(x, y_bin)
    _write(
        repo,
        "xgb_bin",
        {"xgboost.json": xb.save_model},
        model_type="xgboost_json",
        is_classifier="true",
        threshold="0.3",
    )
    refs["xgb_bin"] = lambda v: (xb.predict_proba(v)[:, 1] > 0.3).astype(np.float32)
    xm = xgb.XGBClassifier(n_estimators=20, max_depth=3).fit(x, y_multi)
    _write(
        repo,
        "xgb_multi",
        {"xgboost.ubj": xm.save_model},
        out=3,
        model_type="xgboost_ubj",
        is_classifier="true",
        predict_proba="true",
    )
    refs["xgb_multi"] = xm.predict_proba
    xs = xgb.XGBClassifier(n_estimators=10, max_depth=3, objective="multi:softmax").fit(x, y_multi)
    _write(repo, "xgb_softmax", {"xgboost.json": xs.save_model}, model_type="xgboost_json", is_classifier="true")
    refs["xgb_softmax"] = xs.predict  # XGBoost's labels; the backend takes the argmax of the class probabilities
    xr = xgb.XGBRegressor(n_estimators=20, max_depth=3).fit(x, y_reg)
    _write(
        repo,
        "xgb_reg",
        {"xgboost.model": lambda p: _quiet(xr.save_model, p)},
        model_type="xgboost",
        output_class="false",
    )
    refs["xgb_reg"] = xr.predict

    lb = lgb.LGBMClassifier(n_estimators=20, num_leaves=8, verbose=-1).fit(x, y_bin)
    _write(
        repo,
        "lgb_bin",
        {"model.txt": lb.booster_.save_model},
        out=2,
        model_type="lightgbm",
        output_class="true",
        predict_proba="true",
    )
    refs["lgb_bin"] = lb.predict_proba
    lm = lgb.LGBMClassifier(n_estimators=20, num_leaves=8, verbose=-1).fit(x, y_multi)
    _write(
        repo,
        "lgb_multi",
        {"custom.txt": lm.booster_.save_model},
        model_type="lightgbm",
        is_classifier="true",
        extra='default_model_filename: "custom.txt"',
    )
    refs["lgb_multi"] = lm.predict

    rf = RandomForestRegressor(n_estimators=10, max_depth=5, random_state=0).fit(x, y_reg)
    _write(
        repo,
        "skl_reg",
        {"checkpoint.tl": treelite.sklearn.import_model(rf).serialize},
        model_type="treelite_checkpoint",
        is_classifier="false",
    )
    refs["skl_reg"] = rf.predict
    rc = RandomForestClassifier(n_estimators=10, max_depth=5, random_state=0).fit(x, y_multi)
    _write(
        repo,
        "skl_multi",
        {"checkpoint.tl": treelite.sklearn.import_model(rc).serialize},
        out=3,
        model_type="treelite_checkpoint",
        is_classifier="true",
        predict_proba="true",
    )
    refs["skl_multi"] = rc.predict_proba

    # bad ones: each fails its own load
    _write(repo, "bad_type", {"model.txt": lb.booster_.save_model}, model_type="catboost", is_classifier="true")
    _write(repo, "bad_missing", {}, model_type="lightgbm", is_classifier="true")
    _write(
        repo,
        "bad_name",
        {"model.txt": lb.booster_.save_model},
        input="INPUT0",
        model_type="lightgbm",
        is_classifier="true",
    )
    _write(
        repo,
        "bad_dtype",
        {"model.txt": lb.booster_.save_model},
        dtype="TYPE_FP64",
        model_type="lightgbm",
        is_classifier="true",
    )
    _write(
        repo,
        "bad_out",
        {"model.txt": lm.booster_.save_model},
        out=2,
        model_type="lightgbm",
        is_classifier="true",
        predict_proba="true",
    )
    _write(repo, "bad_class", {"model.txt": lb.booster_.save_model}, model_type="lightgbm")
    _write(
        repo,
        "bad_threshold",
        {"model.txt": lb.booster_.save_model},
        model_type="lightgbm",
        is_classifier="true",
        threshold="high",
    )
    with running_server([repo], tmp / "server.log", ["--exit-on-error=false"]) as server:
        yield server, refs


def _infer(client: grpcclient.InferenceServerClient, model: str, x: np.ndarray) -> np.ndarray:
    inp = grpcclient.InferInput("input__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out: np.ndarray = client.infer(model, [inp]).as_numpy("output__0")
    return out


GOOD = ["xgb_bin", "xgb_multi", "xgb_softmax", "xgb_reg", "lgb_bin", "lgb_multi", "skl_reg", "skl_multi"]


def test_fil_answers_equal_the_frameworks_own(fil: Any) -> None:
    server, refs = fil
    client = grpcclient.InferenceServerClient(server.url)
    x = np.random.default_rng(1).random((40, FEATURES), dtype=np.float32)
    for model in GOOD:
        got = _infer(client, model, x)
        want = np.asarray(refs[model](x), dtype=np.float32)
        assert got.dtype == np.float32, model
        assert got.shape == want.shape, (model, got.shape, want.shape)  # dims [1] -> [batch], as FIL answers
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=model)
    # classes and thresholds really decide: both classes appear in the binary answer
    assert set(np.unique(_infer(client, "xgb_bin", x))) == {0.0, 1.0}
    config = client.get_model_config("xgb_bin", as_json=True)["config"]
    assert config["backend"] == "fil" and config.get("default_model_filename", "") == ""
    client.close()


def test_fil_dynamic_batching_merges_requests(fil: Any) -> None:
    server, refs = fil
    client = grpcclient.InferenceServerClient(server.url)
    rng = np.random.default_rng(2)
    rows = [rng.random((int(rng.integers(1, 5)), FEATURES), dtype=np.float32) for _ in range(32)]
    before = client.get_inference_statistics("lgb_bin").model_stats[0]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda r: _infer(client, "lgb_bin", r), rows))
    for r, got in zip(rows, answers, strict=True):
        np.testing.assert_allclose(got, refs["lgb_bin"](r), rtol=1e-5, atol=1e-6)
    after = client.get_inference_statistics("lgb_bin").model_stats[0]
    inferences = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    assert inferences == sum(len(r) for r in rows)
    assert executions < len(rows), f"{executions} executions for {len(rows)} requests: nothing was batched"
    client.close()


def test_fil_bad_models_fail_their_own_load(fil: Any) -> None:
    server, _ = fil
    client = grpcclient.InferenceServerClient(server.url)
    index = {m.name: m for m in client.get_model_repository_index().models}
    expected = {
        "bad_type": "model_type 'catboost' not recognized",
        "bad_missing": "model.txt",
        "bad_name": "'INPUT0'",
        "bad_dtype": "TYPE_FP64",
        "bad_out": "dims: [ 3 ]",
        "bad_class": "is_classifier",
        "bad_threshold": "Bad input for parameter threshold",
    }
    for name, fragment in expected.items():
        assert index[name].state == "UNAVAILABLE", name
        assert f"'{name}'" in index[name].reason and fragment in index[name].reason, (name, index[name].reason)
    assert "does not exist" in index["bad_missing"].reason
    for name in GOOD:
        assert index[name].state == "READY", (name, index[name].reason)
    client.close()


@pytest.mark.skipif(not os.access(PERF_ANALYZER, os.X_OK), reason="perf_analyzer is not installed")
def test_perf_analyzer_on_a_fil_model(fil: Any) -> None:
    server, _ = fil
    perf(server.url, "-m", "xgb_bin", "-b", "4", "--concurrency-range", "4")
