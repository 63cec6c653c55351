"""Which process is which: a worker's command line (ps, top) names its model, version and instance, while the
model inside sees no worker arguments in sys.argv (unittest.main and argparse parse an empty command line, as
under Triton's stub) and none of the worker's plumbing in its environment."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from tests.conftest import write_model

CONFIG = """
name: "argv_check"
backend: "python"
max_batch_size: 0
input [{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }]
output [{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }]
instance_group [{ kind: KIND_CPU count: 2 }]
"""

# parses the command line the way test-style models do (Triton's QA models call unittest.main on themselves)
MODEL = """
import argparse
import json
import os
import sys
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils


class Arithmetic(unittest.TestCase):
    def test_add(self):
        self.assertEqual(int(np.add(2, 3)), 5)


class TritonPythonModel:
    def initialize(self, args):
        self.parsed = vars(argparse.ArgumentParser().parse_args())
        self.argv = list(sys.argv)
        self.env = sorted(k for k in os.environ if k.startswith("TRIREME_WORKER"))

    def execute(self, requests):
        result = unittest.main("model", exit=False).result
        info = {"argv": self.argv, "parsed": self.parsed, "ran": result.testsRun, "ok": result.wasSuccessful(),
                "env": self.env}
        out = np.array([json.dumps(info)], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
"""


def _ask(url: str) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(url)
    try:
        t = grpcclient.InferInput("IN", [1], "FP32")
        t.set_data_from_numpy(np.ones(1, np.float32))
        out = client.infer("argv_check", [t]).as_numpy("OUT")
        assert out is not None
        return dict(json.loads(out[0]))
    finally:
        client.close()


def test_model_sees_no_worker_arguments_and_ps_names_each_instance(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "argv_check", CONFIG, MODEL)
    server = start_server([repo])
    info = _ask(server.url)
    assert info["argv"] == [""]  # what Triton's stub gives a model
    assert info["parsed"] == {}
    assert info["ran"] == 1 and info["ok"] is True  # unittest.main("model") parsed argv and ran the test
    assert info["env"] == []
    lines = []
    for pid in server.worker_pids():
        lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0"))
    words = sorted(tuple(w.decode() for w in line[-3:]) for line in lines)
    assert words == [
        ("model=argv_check", "version=1", "instance=argv_check_0_0"),
        ("model=argv_check", "version=1", "instance=argv_check_0_1"),
    ], lines
    # ps shows the same words (what an operator reads)
    pids = ",".join(map(str, server.worker_pids()))
    ps = subprocess.run(["ps", "-ww", "-o", "args=", "-p", pids], capture_output=True)
    assert b"service.worker.main model=argv_check version=1 instance=argv_check_0_1" in ps.stdout
