"""LitServe: one LitAPI; with --batch N LitServe gathers up to N requests (1 ms) into one predict call.

Usage: <litserve venv>/bin/python litserve_server.py PORT [--batch N]
Route: POST /predict with {"data": [16 floats]} (identity, answered {"data": [...]}) or {"features": [16 floats]}
(the model, answered {"label": n}); with --batch only model requests.
"""

from __future__ import annotations

import argparse
from typing import Any

import litserve as ls
import numpy as np
from common import build_model


class PeerAPI(ls.LitAPI):
    def setup(self, device: str) -> None:
        self.model = build_model()

    # no annotation: LitServe then hands over the parsed JSON body (an annotation would make FastAPI expect a
    # query parameter)
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        return request

    def batch(self, inputs: list[dict[str, Any]]) -> np.ndarray:
        return np.asarray([r["features"] for r in inputs], dtype=np.float32)

    def predict(self, x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return self.model.predict(x)
        if "data" in x:
            return x["data"]
        return int(self.model.predict(np.asarray([x["features"]], dtype=np.float32))[0])

    def unbatch(self, output: Any) -> list[int]:
        return [int(v) for v in output]

    def encode_response(self, output: Any) -> dict[str, Any]:
        return {"data": output} if isinstance(output, list) else {"label": output}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    api = PeerAPI(max_batch_size=args.batch, batch_timeout=0.001)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1)
    server.run(host="127.0.0.1", port=args.port, num_api_servers=1, generate_client_file=False, log_level="warning")
