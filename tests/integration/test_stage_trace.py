"""Opt-in stage timestamps (TRIREME_STAGE_TRACE): one line per ModelInfer with server and worker stages in order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

STAGES = ["handler", "decoded", "prepared", "dispatch", "frame_sent", "enqueued", "worker_start", "execute_start"]


def test_stage_trace_records_each_request(start_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "stages.jsonl"
    monkeypatch.setenv("TRIREME_STAGE_TRACE", str(trace))
    server = start_server()
    client = grpcclient.InferenceServerClient(server.url)
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    for _ in range(3):
        x = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        x.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("identity_fp32", [x]).as_numpy("OUTPUT0"), data)
    client.close()
    server.stop()
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(lines) == 3
    for stamps in lines:
        names = [name for name, _ in stamps]
        for name in [*STAGES, "execute_end", "worker_send", "response_frame", "resumed", "encoded"]:
            assert name in names
        at = dict(stamps)
        ordered = [at[n] for n in ("handler", "decoded", "prepared", "dispatch", "worker_start", "execute_end")]
        assert ordered == sorted(ordered)
        assert at["worker_send"] <= at["response_frame"] <= at["resumed"] <= at["encoded"]
