"""BentoML: one service, adaptive batching (batchable=True) on one API.

Usage: cd tests/bench/peers && <bentoml venv>/bin/bentoml serve bentoml_server:Peer --host 127.0.0.1 --port PORT
APIs: /identity {"data": [...]}, /predict {"features": [...]}, /predict_batched {"features": [[...]]} (a batch of one
row per request, merged by BentoML up to 32 rows within its default latency budget).
"""

from __future__ import annotations

import bentoml
import numpy as np
from common import build_model


@bentoml.service(workers=1)
class Peer:
    def __init__(self) -> None:
        self.model = build_model()

    @bentoml.api
    def identity(self, data: list[float]) -> list[float]:
        return data

    @bentoml.api
    def predict(self, features: list[float]) -> int:
        return int(self.model.predict(np.asarray([features], dtype=np.float32))[0])

    @bentoml.api(batchable=True, max_batch_size=32)  # max_latency_ms: BentoML's default
    def predict_batched(self, features: np.ndarray) -> np.ndarray:
        return self.model.predict(features.astype(np.float32))
