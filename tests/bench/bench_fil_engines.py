"""Benchmark: which engine the fil backend should run each model type on — the framework's own predict
(XGBoost inplace_predict, LightGBM predict) against Treelite's GTIL on the same model, one thread, in process.

Usage: .venv/bin/python tests/bench/bench_fil_engines.py [--seconds 1.0] [--threads 1]
Models: 32 features, binary, XGBoost 100 trees depth 6 and LightGBM 100 trees 63 leaves. Prints us per call
(median of calls) per batch size, and the largest difference between the engines' answers.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def per_call_us(fn: Callable[[], Any], seconds: float) -> float:
    fn()
    times = []
    end = time.perf_counter() + seconds
    while (t0 := time.perf_counter()) < end:
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1, help="threads per predict call (all engines)")
    args = ap.parse_args()
    import lightgbm as lgb
    import treelite
    import treelite.gtil as gtil
    import xgboost as xgb

    rng = np.random.default_rng(0)
    x = rng.random((5000, 32), dtype=np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0.8).astype(int)
    n = args.threads
    booster = xgb.train({"objective": "binary:logistic", "max_depth": 6, "nthread": n}, xgb.DMatrix(x, y), 100)
    lgbm = lgb.train({"objective": "binary", "num_leaves": 63, "verbose": -1, "num_threads": 1}, lgb.Dataset(x, y), 100)
    tl_xgb = treelite.frontend.from_xgboost(booster)
    tl_lgb = treelite.frontend.from_lightgbm(lgbm)
    engines: dict[str, Callable[[np.ndarray], Any]] = {
        "xgboost inplace_predict": lambda v: booster.inplace_predict(v, validate_features=False),
        "treelite gtil (xgboost model)": lambda v: gtil.predict(tl_xgb, v, nthread=n),
        "lightgbm predict": lambda v: lgbm.predict(v, num_threads=n),
        "treelite gtil (lightgbm model)": lambda v: gtil.predict(tl_lgb, v, nthread=n),
    }
    batches = (1, 4, 16, 64, 1024)
    print(f"\n## fil engines: us per predict call, {n} thread(s) (32 features, 100 trees)\n")
    print("| engine | " + " | ".join(f"batch {b}" for b in batches) + " |")
    print("|---|" + "---|" * len(batches))
    for name, fn in engines.items():
        cells = [per_call_us(lambda f=fn, v=x[:b]: f(v), args.seconds) for b in batches]  # type: ignore[misc]
        print(f"| {name} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
    d_xgb = np.abs(booster.inplace_predict(x) - gtil.predict(tl_xgb, x).ravel()).max()
    d_lgb = np.abs(lgbm.predict(x) - gtil.predict(tl_lgb, x).ravel()).max()
    print(f"\nlargest answer difference framework vs GTIL: xgboost {d_xgb:.1e}, lightgbm {d_lgb:.1e}")


if __name__ == "__main__":
    main()
