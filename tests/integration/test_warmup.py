"""model_warmup: samples run on every instance before READY, are not counted in statistics, and fail the load."""

from __future__ import annotations

from pathlib import Path

import tritonclient.grpc as grpcclient

from tests.conftest import write_model

CONFIG = """
    name: "warm"
    backend: "python"
    max_batch_size: 4
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 3 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 3 ] } ]
    instance_group [ { count: 2 kind: KIND_CPU } ]
    model_warmup [
      {
        name: "zeros" batch_size: 2 count: 2
        inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } }
      }
    ]
"""
MODEL = """
    import os

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.log = os.path.join(args["model_repository"], "seen.txt")
            self.instance = args["model_instance_name"]

        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                if os.path.exists(self.log + ".fail"):
                    raise RuntimeError("cannot warm up")
                with open(self.log, "a") as f:
                    f.write(f"{self.instance} {r.request_id()} {list(x.shape)} {float(x.sum())}\\n")
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
            return out
"""


def test_warmup_runs_on_every_instance_before_ready(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    model_dir = write_model(tmp_path, "warm", CONFIG, MODEL)
    server = start_server([tmp_path])
    lines = (model_dir / "seen.txt").read_text().splitlines()
    assert sorted(lines) == sorted([f"warm_0_{i} warmup_zeros [2, 3] 0.0" for i in (0, 1) for _ in range(2)]), lines
    client = grpcclient.InferenceServerClient(server.url)
    stats = client.get_inference_statistics("warm").model_stats[0]
    assert stats.execution_count == 0 and stats.inference_stats.success.count == 0  # warmup is not traffic
    client.close()


def test_failing_warmup_fails_the_load(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    model_dir = write_model(tmp_path, "warm", CONFIG, MODEL)
    (model_dir / "seen.txt.fail").write_text("")
    server = start_server([tmp_path], ["--exit-on-error=false"])
    client = grpcclient.InferenceServerClient(server.url)
    (row,) = client.get_model_repository_index().models
    assert row.state == "UNAVAILABLE"
    assert "failed to run warmup sample 'zeros'" in row.reason and "cannot warm up" in row.reason
    client.close()
