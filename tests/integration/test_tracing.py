"""Request tracing through a real server: the trace extension's settings, Triton-format trace files (timestamps,
tensors, ensemble and BLS children), sampling rate and count, and OpenTelemetry export with a propagated
`traceparent` received by a local OTLP/HTTP collector."""

from __future__ import annotations

import json
import queue
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import free_port, running_server, write_model
from tests.integration import models
from tests.integration.models import python_config

IDENTITY_PY = models.IDENTITY_PY

BLS_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            call = pb_utils.InferenceRequest(model_name="ident", requested_output_names=["OUTPUT0"],
                                             inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT0")],
                                             trace=r.trace())
            result = call.exec()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                       pb_utils.get_output_tensor_by_name(result, "OUTPUT0").as_numpy())]))
        return out
"""


def io_config(name: str) -> str:
    return python_config(name)


ENSEMBLE = """
name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "ident" model_version: -1 input_map { key: "INPUT0" value: "INPUT0" }
    output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "ident2" model_version: -1 input_map { key: "INPUT0" value: "mid" }
    output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }
"""

ORDER = [
    "GRPC_WAITREAD_START",
    "GRPC_WAITREAD_END",
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
    "GRPC_SEND_START",
    "GRPC_SEND_END",
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("trace_repo")
    write_model(repo, "ident", io_config("ident"), IDENTITY_PY)
    write_model(repo, "ident2", io_config("ident2"), IDENTITY_PY)
    write_model(repo, "bls", io_config("bls"), BLS_PY)
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(ENSEMBLE)
    return repo


def infer(client: Any, model: str, n: int = 4, **kw: Any) -> np.ndarray:
    x = np.arange(n, dtype=np.float32)
    inp = grpcclient.InferInput("INPUT0", [n], "FP32")
    inp.set_data_from_numpy(x)
    out = client.infer(model, [inp], **kw).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, x)
    return x


def traces_by_id(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Merge a Triton trace file's records by id, as Triton's trace summary tool does."""
    traces: dict[int, dict[str, Any]] = {}
    for r in records:
        t = traces.setdefault(r["id"], {"timestamps": {}, "tensors": []})
        for k in ("model_name", "model_version", "parent_id", "request_id"):
            if k in r:
                t[k] = r[k]
        for ts in r.get("timestamps", []):
            t["timestamps"][ts["name"]] = ts["ns"]
        if "tensor" in r:
            t["tensors"].append((r["activity"], r["tensor"]))
    return traces


def read_files(prefix: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for f in sorted(prefix.parent.glob(prefix.name + ".*"), key=lambda p: int(p.suffix[1:])):
        records.extend(json.loads(f.read_text()))
    return records


def wait_for_traces(prefix: Path, roots: int, timeout_s: float = 20.0) -> dict[int, dict[str, Any]]:
    """The traces in <prefix>.N files once at least `roots` top-level traces are there (a writer thread writes
    them shortly after the requests finish)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            traces = traces_by_id(read_files(prefix))
        except json.JSONDecodeError:  # a file being written
            traces = {}
        if sum(1 for t in traces.values() if "parent_id" not in t) >= roots or time.monotonic() > deadline:
            return traces
        time.sleep(0.05)


def test_trace_settings_round_trip(repo: Path, tmp_path: Path) -> None:
    with running_server([repo], tmp_path / "server.log") as server:
        client = grpcclient.InferenceServerClient(server.url)
        assert "trace" in client.get_server_metadata(as_json=True)["extensions"]
        settings = client.get_trace_settings(as_json=True)["settings"]
        assert settings["trace_level"]["value"] == ["OFF"]
        assert settings["trace_rate"]["value"] == ["1000"]
        assert settings["trace_count"]["value"] == ["-1"]
        assert settings["log_frequency"]["value"] == ["0"]
        assert settings["trace_mode"]["value"] == ["triton"]

        updated = client.update_trace_settings(
            settings={"trace_rate": "7", "trace_level": ["TIMESTAMPS"]}, as_json=True
        )
        assert updated["settings"]["trace_rate"]["value"] == ["7"]
        # a model's settings start from the global ones; its own keys override them
        model = client.update_trace_settings(model_name="ident", settings={"trace_count": "5"}, as_json=True)
        assert model["settings"]["trace_rate"]["value"] == ["7"]
        assert model["settings"]["trace_count"]["value"] == ["5"]
        client.update_trace_settings(settings={"trace_rate": "9"})
        model = client.get_trace_settings(model_name="ident", as_json=True)["settings"]
        assert model["trace_rate"]["value"] == ["9"] and model["trace_count"]["value"] == ["5"]
        # clearing a model key falls back to the global value
        model = client.update_trace_settings(model_name="ident", settings={"trace_count": None}, as_json=True)
        assert model["settings"]["trace_count"]["value"] == ["-1"]

        with pytest.raises(InferenceServerException, match="unknown model"):
            client.get_trace_settings(model_name="nope")
        with pytest.raises(InferenceServerException, match="unsupported trace level 'LOUD'"):
            client.update_trace_settings(settings={"trace_level": ["LOUD"]})
        with pytest.raises(InferenceServerException, match="Unable to parse 'trace_rate'"):
            client.update_trace_settings(settings={"trace_rate": "often"})
        with pytest.raises(InferenceServerException, match="can not be updated through network protocol"):
            client.update_trace_settings(settings={"trace_file": "/tmp/elsewhere.json"})
        client.close()


def test_trace_file_timestamps_are_ordered_and_match_statistics(repo: Path, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS"]
    args += ["--trace-config", "rate=1"]
    with running_server([repo], tmp_path / "server.log", args) as server:
        client = grpcclient.InferenceServerClient(server.url)
        for _ in range(5):
            infer(client, "ident", request_id="r1")
        stats = client.get_inference_statistics("ident").model_stats[0].inference_stats
        client.close()
    # log_frequency 0: written at exit
    traces = traces_by_id(json.loads(trace_file.read_text()))
    assert len(traces) == 5
    compute = {"input": 0, "infer": 0, "output": 0}
    for t in traces.values():
        assert t["model_name"] == "ident" and t["model_version"] == 1 and t["request_id"] == "r1"
        stamps = t["timestamps"]
        assert list(stamps) == ORDER
        values = [stamps[name] for name in ORDER]
        assert values == sorted(values), stamps
        compute["input"] += stamps["COMPUTE_INPUT_END"] - stamps["COMPUTE_START"]
        compute["infer"] += stamps["COMPUTE_OUTPUT_START"] - stamps["COMPUTE_INPUT_END"]
        compute["output"] += stamps["COMPUTE_END"] - stamps["COMPUTE_OUTPUT_START"]
    assert compute["input"] == stats.compute_input.ns
    assert compute["infer"] == stats.compute_infer.ns
    assert compute["output"] == stats.compute_output.ns


def test_a_large_response_with_tracing_on_is_answered_whole_and_traced(repo: Path, tmp_path: Path) -> None:
    # above LARGE_BYTES (256 KiB) ModelInfer answers through the large-message serialiser, traced or not (the
    # traced handler used to encode with protobuf instead); tests/unit/test_grpc_infer_path.py checks the path
    trace_file = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS"]
    args += ["--trace-config", "rate=1"]
    n = (3 << 20) // 4  # 3 MiB of FP32
    with running_server([repo], tmp_path / "server.log", args) as server:
        client = grpcclient.InferenceServerClient(server.url)
        infer(client, "ident", n=n)
        client.close()
    traces = traces_by_id(json.loads(trace_file.read_text()))
    assert len(traces) == 1
    assert list(next(iter(traces.values()))["timestamps"]) == ORDER


def test_rate_count_children_and_tensors(repo: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "t.json"
    args = ["--trace-config", f"triton,file={prefix}", "--trace-config", "triton,log-frequency=1"]
    with running_server([repo], tmp_path / "server.log", args) as server:
        client = grpcclient.InferenceServerClient(server.url)
        infer(client, "ident")
        assert read_files(prefix) == []  # level OFF: nothing traced

        # every 2nd request, 3 traces at most: 10 requests -> requests 2, 4, 6
        client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "3"})
        for n in range(1, 11):
            infer(client, "ident", n=n)
        traces = wait_for_traces(prefix, 3)
        assert sorted(len(t["tensors"]) for t in traces.values()) == [0, 0, 0]
        assert len(traces) == 3
        assert client.get_trace_settings(as_json=True)["settings"]["trace_count"]["value"] == ["0"]

        client.update_trace_settings(
            settings={"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1", "trace_count": "-1"}
        )
        before = set(traces)
        infer(client, "ens")
        infer(client, "bls")
        infer(client, "ident", n=3)
        new = {i: t for i, t in wait_for_traces(prefix, len(before) + 3).items() if i not in before}
        client.close()
    by_model: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, t in new.items():
        by_model.setdefault(t["model_name"], []).append((i, t))
    ((ens_id, ens),) = by_model["ens"]
    children = {t["model_name"]: t for _, t in new.items() if t.get("parent_id") == ens_id}
    assert set(children) == {"ident", "ident2"}
    assert ens["timestamps"]["REQUEST_START"] <= children["ident"]["timestamps"]["REQUEST_START"]
    assert children["ident2"]["timestamps"]["REQUEST_END"] <= ens["timestamps"]["REQUEST_END"]
    ((bls_id, _),) = by_model["bls"]
    assert [t["model_name"] for t in new.values() if t.get("parent_id") == bls_id] == ["ident"]
    # TENSORS: what entered the queue and what the backend produced
    ((_, plain),) = [(i, t) for i, t in by_model["ident"] if "parent_id" not in t]
    activities = {
        (a, tensor["name"], tensor["data"], tensor["shape"], tensor["dtype"]) for a, tensor in plain["tensors"]
    }
    assert ("TENSOR_QUEUE_INPUT", "INPUT0", "0.0,1.0,2.0", "3", "FP32") in activities
    assert ("TENSOR_BACKEND_OUTPUT", "OUTPUT0", "0.0,1.0,2.0", "3", "FP32") in activities


class _Collector(BaseHTTPRequestHandler):
    """A minimal OTLP/HTTP receiver: every POST body goes to the server's queue."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.bodies.put((self.path, body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[int, queue.Queue[tuple[str, bytes]]]]:
    port = free_port()
    httpd = ThreadingHTTPServer(("127.0.0.1", port), _Collector)
    httpd.bodies = queue.Queue()  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield port, httpd.bodies  # type: ignore[attr-defined]
    httpd.shutdown()
    httpd.server_close()


def test_opentelemetry_export_with_propagated_parent(
    repo: Path, tmp_path: Path, collector: tuple[int, queue.Queue[tuple[str, bytes]]]
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    port, bodies = collector
    args = [
        "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "rate=0",  # only requests that carry a traceparent
        "--trace-config", f"opentelemetry,url=http://127.0.0.1:{port}/v1/traces",
        "--trace-config", "opentelemetry,bsp_schedule_delay=100",
        "--trace-config", "opentelemetry,resource=deployment=test",
    ]  # fmt: skip
    trace_id, parent_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with running_server([repo], tmp_path / "server.log", args) as server:
        client = grpcclient.InferenceServerClient(server.url)
        infer(client, "ident")  # no traceparent and rate 0: not traced
        infer(client, "ens", headers={"traceparent": f"00-{trace_id}-{parent_span}-01"})
        spans: list[Any] = []
        resource: dict[str, str] = {}
        while not any(s.name == "ident2" for s in spans):
            path, body = bodies.get(timeout=30)
            assert path == "/v1/traces"
            export = ExportTraceServiceRequest.FromString(body)
            for rs in export.resource_spans:
                resource.update({a.key: a.value.string_value for a in rs.resource.attributes})
                for ss in rs.scope_spans:
                    spans.extend(ss.spans)
        client.close()
    assert resource["service.name"] == "triton-inference-server" and resource["deployment"] == "test"
    assert {s.trace_id.hex() for s in spans} == {trace_id}
    by_name = {s.name: s for s in spans}
    assert by_name["InferRequest"].parent_span_id.hex() == parent_span
    assert by_name["ens"].parent_span_id == by_name["InferRequest"].span_id
    for step in ("ident", "ident2"):
        assert by_name[step].parent_span_id == by_name["ens"].span_id
    computes = [s for s in spans if s.name == "compute"]
    assert len(computes) == 2 and {c.parent_span_id for c in computes} == {
        by_name["ident"].span_id,
        by_name["ident2"].span_id,
    }
    events = {e.name for e in by_name["InferRequest"].events}
    assert {"GRPC_WAITREAD_START", "GRPC_SEND_END"} <= events
    attrs = {a.key: a.value for a in by_name["ident"].attributes}
    assert attrs["triton.model_name"].string_value == "ident"


def test_trace_settings_and_stamps_over_http(repo: Path, tmp_path: Path) -> None:
    import tritonclient.http as httpclient

    prefix = tmp_path / "h.json"
    args = ["--trace-config", f"triton,file={prefix}", "--trace-config", "triton,log-frequency=1"]
    with running_server([repo], tmp_path / "server.log", args) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.get_trace_settings()["trace_level"] == ["OFF"]
        updated = client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        assert updated["trace_level"] == ["TIMESTAMPS"] and updated["trace_rate"] == "1"
        model = client.update_trace_settings(model_name="ident", settings={"trace_rate": "3"})
        assert model["trace_rate"] == "3"
        assert client.update_trace_settings(model_name="ident", settings={"trace_rate": None})["trace_rate"] == "1"
        with pytest.raises(InferenceServerException, match="unsupported trace level"):
            client.update_trace_settings(settings={"trace_level": ["LOUD"]})
        x = np.arange(4, dtype=np.float32)
        inp = httpclient.InferInput("INPUT0", [4], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("ident", [inp]).as_numpy("OUTPUT0"), x)
        client.close()
        traces = wait_for_traces(prefix, 1)
    (trace,) = traces.values()
    names = list(trace["timestamps"])
    assert names[:2] == ["HTTP_RECV_START", "HTTP_RECV_END"] and names[-2:] == ["HTTP_SEND_START", "HTTP_SEND_END"]
    assert "COMPUTE_START" in names and "REQUEST_END" in names


def test_a_cache_hit_is_traced_to_its_end(repo: Path, tmp_path: Path) -> None:
    cached = tmp_path / "repo"
    shutil.copytree(repo, cached)
    config = cached / "ident" / "config.pbtxt"
    config.write_text(config.read_text() + "\nresponse_cache { enable: true }\n")
    prefix = tmp_path / "c.json"
    args = ["--cache-config", "local,size=1048576", "--trace-config", f"triton,file={prefix}"]
    args += [
        "--trace-config",
        "triton,log-frequency=1",
        "--trace-config",
        "level=TIMESTAMPS",
        "--trace-config",
        "rate=1",
    ]
    with running_server([cached], tmp_path / "server.log", args) as server:
        client = grpcclient.InferenceServerClient(server.url)
        for _ in range(2):  # a miss, then a hit
            infer(client, "ident")
        assert client.get_inference_statistics("ident").model_stats[0].inference_stats.cache_hit.count == 1
        # the hit of an ensemble step ends its child trace too
        for _ in range(2):
            infer(client, "ens")
        client.close()
        traces = wait_for_traces(prefix, 4)
    idents = [t for t in traces.values() if t["model_name"] == "ident"]
    assert len(idents) == 4  # 2 direct, 2 as the ensemble's first step
    for t in idents:
        assert {"QUEUE_START", "REQUEST_END"} <= set(t["timestamps"]), t
    # only the first request ran: the direct hit and both steps (the same input, so the same key) came from the cache
    hits = [t for t in idents if "COMPUTE_START" not in t["timestamps"]]
    assert len(hits) == 3
