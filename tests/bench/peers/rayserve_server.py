"""Ray Serve: one deployment behind Serve's HTTP proxy, with Serve's own batching (@serve.batch) on one route.

Usage: <rayserve venv>/bin/python rayserve_server.py PORT
Routes: /identity, /predict (one row per call), /predict_batched (rows gathered by @serve.batch, up to 32, 1 ms).
"""

# no `from __future__ import annotations`: FastAPI must see the body models themselves inside the Ray replica

import signal
import sys
import time

import numpy as np
import ray
from common import build_model
from fastapi import FastAPI
from pydantic import BaseModel
from ray import serve


class Data(BaseModel):
    data: list[float]


class Features(BaseModel):
    features: list[float]


app = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=64)
@serve.ingress(app)
class Peer:
    def __init__(self) -> None:
        self.model = build_model()

    @app.post("/identity")
    async def identity(self, item: Data) -> dict[str, list[float]]:
        return {"data": item.data}

    @app.post("/predict")
    async def predict(self, item: Features) -> dict[str, int]:
        return {"label": int(self.model.predict(np.asarray([item.features], dtype=np.float32))[0])}

    @app.post("/predict_batched")
    async def predict_batched(self, item: Features) -> dict[str, int]:
        return {"label": await self.rows(item.features)}

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.001)
    async def rows(self, rows: list[list[float]]) -> list[int]:
        return [int(v) for v in self.model.predict(np.asarray(rows, dtype=np.float32))]


def main() -> None:
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})
    serve.run(Peer.bind(), route_prefix="/")

    def bye(*_: object) -> None:
        serve.shutdown()
        ray.shutdown()
        sys.exit(0)

    signal.signal(signal.SIGTERM, bye)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
