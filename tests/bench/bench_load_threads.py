"""Start-up time with 20 Python models whose initialize() takes 1 s, by --model-load-thread-count.

Run: python -m tests.bench.bench_load_threads [--models 20] [--threads 1 4 20]
Prints one row per thread count: seconds from the server's start to "Started GRPCInferenceService".
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tests.conftest import ServerProcess, write_model
from tests.integration.test_load_threads import CONFIG  # the same one-input model config as the tests

MODEL = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        time.sleep(1.0)  # a model that takes a second to set up (weights, a warm cache, ...)

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 4, 20])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        for i in range(args.models):
            write_model(repo, f"slow_{i}", CONFIG.format(name=f"slow_{i}"), MODEL)
        print(f"{'--model-load-thread-count':>26} {'start-up s':>10}")
        for n in args.threads:
            started = time.monotonic()
            server = ServerProcess([repo], [f"--model-load-thread-count={n}"], Path(tmp) / f"server{n}.log")
            try:
                server.wait_ready(600)
                print(f"{n:>26} {time.monotonic() - started:>10.1f}", flush=True)
            finally:
                server.stop()


if __name__ == "__main__":
    main()
