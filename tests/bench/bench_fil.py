"""Benchmark: tree models on the fil backend (XGBoost, LightGBM, a scikit-learn forest as a Treelite checkpoint)
against each framework's own predict called in this process, with the real perf_analyzer.

Usage: .venv/bin/python tests/bench/bench_fil.py [--rounds 2] [--stability "-p 2000 -s 30 -r 8"]
Needs the fil extra and perf_analyzer ($TRIREME_TOOLS/bin, from tools/install-triton-tools.sh).

Models: 32 features, binary classifiers (XGBoost 100 trees depth 6, LightGBM 100 trees 63 leaves, scikit-learn
RandomForest 50 trees depth 8), each `dynamic_batching {}` on one CPU instance (the worker's default: one
OpenMP thread). The server runs with --model-control-mode=explicit so each model's load is timed on its own,
and the worker it starts is known (its RSS is read after the traffic). Per round, per model: perf_analyzer
-b 4 at concurrency 8 (rows/s, and the server-side mean batch in rows) and -b 1 at concurrency 1 (p50); the
ceiling is the same framework call in a loop here, one thread, at batch 4, at the served mean batch, and at
batch 1. Overhead per request = served p50 at c=1 minus the in-process p50 at batch 1.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import (  # noqa: E402
    free_port,
    inference_counts,
    perf_analyzer,
    rounds_and_attempts,
    start_trireme,
    stop,
    wait_started,
)

FEATURES = 32
CONFIG = """\
backend: "fil"
max_batch_size: 1024
input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {features} ] }} ]
output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
dynamic_batching {{ }}
parameters [
  {{ key: "model_type" value: {{ string_value: "{model_type}" }} }},
  {{ key: "is_classifier" value: {{ string_value: "true" }} }}
]
"""


def build(repo: Path) -> dict[str, Callable[[np.ndarray], Any]]:
    """Train the three models, write the repository, return each model's in-process predict (one thread)."""
    import lightgbm as lgb
    import treelite
    import treelite.gtil
    import treelite.sklearn
    import xgboost as xgb
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.default_rng(0)
    x = rng.random((5000, FEATURES), dtype=np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] + rng.normal(0, 0.1, 5000) > 0.8).astype(int)
    out: dict[str, Callable[[np.ndarray], Any]] = {}

    def folder(name: str, model_type: str) -> Path:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(features=FEATURES, model_type=model_type))
        return repo / name / "1"

    booster = xgb.train({"objective": "binary:logistic", "max_depth": 6, "nthread": 1}, xgb.DMatrix(x, y), 100)
    booster.save_model(str(folder("xgboost", "xgboost_json") / "xgboost.json"))
    out["xgboost"] = lambda v: booster.inplace_predict(v, validate_features=False)
    lgbm = lgb.train({"objective": "binary", "num_leaves": 63, "verbose": -1, "num_threads": 1}, lgb.Dataset(x, y), 100)
    lgbm.save_model(str(folder("lightgbm", "lightgbm") / "model.txt"))
    out["lightgbm"] = lambda v: lgbm.predict(v, num_threads=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        forest = RandomForestClassifier(n_estimators=50, max_depth=8, random_state=0, n_jobs=1).fit(x, y)
    tl = treelite.sklearn.import_model(forest)
    tl.serialize(str(folder("sklearn_rf", "treelite_checkpoint") / "checkpoint.tl"))
    out["sklearn_rf"] = lambda v: treelite.gtil.predict(tl, v, nthread=1)
    return out


def direct(fn: Callable[[np.ndarray], Any], batch: int, seconds: float = 2.0) -> tuple[float, float]:
    """fn on `batch` rows in a loop here: (rows/s, p50 us per call)."""
    x = np.random.default_rng(1).random((batch, FEATURES), dtype=np.float32)
    for _ in range(20):
        fn(x)
    times = []
    end = time.perf_counter() + seconds
    while (t0 := time.perf_counter()) < end:
        fn(x)
        times.append(time.perf_counter() - t0)
    return batch * len(times) / sum(times), float(np.percentile(np.array(times) * 1e6, 50))


def main() -> None:
    args, attempts = rounds_and_attempts(__doc__)
    import tritonclient.grpc as grpcclient

    res: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        predicts = build(repo)
        port = free_port()
        log = Path(tmp) / "server.log"
        proc = start_trireme(repo, port, log, extra_args=["--model-control-mode=explicit"])
        wait_started(proc, log)
        workers: dict[str, int] = {}
        try:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
            for name in predicts:
                known = set(psutil.Process(proc.pid).children())
                t0 = time.perf_counter()
                client.load_model(name)
                res.setdefault(name, {}).setdefault("load_s", []).append(time.perf_counter() - t0)
                (worker,) = set(psutil.Process(proc.pid).children()) - known
                workers[name] = worker.pid
            for rnd in range(args.rounds):
                for name, fn in predicts.items():
                    r = res[name]
                    before = inference_counts(port, name)
                    row = perf_analyzer(name, port, 8, attempts, Path(tmp) / "pa.csv", extra=["-b", "4"])
                    after = inference_counts(port, name)
                    mean_batch = (after[0] - before[0]) / max(1, after[1] - before[1])
                    r.setdefault("served", []).append(float(row["Inferences/Second"]))
                    r.setdefault("mean_batch", []).append(mean_batch)
                    row = perf_analyzer(name, port, 1, attempts, Path(tmp) / "pa.csv")
                    r.setdefault("served_p50", []).append(float(row["p50 latency"]))
                    r.setdefault("direct4", []).append(direct(fn, 4)[0])
                    r.setdefault("direct_mean", []).append(direct(fn, max(1, round(mean_batch)))[0])
                    r.setdefault("direct_p50", []).append(direct(fn, 1)[1])
                    sys.stderr.write(f"{name}: {r['served'][-1]:.0f} rows/s served, batch {mean_batch:.1f}\n")
                sys.stderr.write(f"round {rnd + 1}/{args.rounds} done\n")
            for name, pid in workers.items():
                res[name]["rss"] = [psutil.Process(pid).memory_info().rss / 2**20]
            client.close()
        finally:
            stop([proc])
    print(f"\n## fil backend, {FEATURES} features, binary classifiers; perf_analyzer -b 4 at concurrency 8\n")
    print("| model | served rows/s (c=8, -b 4) | mean batch (rows) | in-process rows/s at batch 4 | in-process rows/s "
          "at the mean batch | served p50 us (c=1, -b 1) | in-process p50 us (batch 1) | overhead us/request | "
          "worker RSS MiB | load s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in res.items():
        m = {k: statistics.median(v) for k, v in r.items()}
        print(
            f"| {name} | {m['served']:.0f} | {m['mean_batch']:.1f} | {m['direct4']:.0f} | {m['direct_mean']:.0f} | "
            f"{m['served_p50']:.0f} | {m['direct_p50']:.0f} | {m['served_p50'] - m['direct_p50']:.0f} | "
            f"{m['rss']:.0f} | {m['load_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
