"""The `triton_grpc_error: true` stream header: the first error ends ModelStreamInfer with that error's gRPC status
instead of travelling in-band, for default-mode and decoupled models (also one that sends its final flag after
the error); without the header errors stay in-band and the stream goes on."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess, running_server, write_model

IO = """
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# IN 0: one response (then the final flag); 1: a response, an error response, then the final flag alone;
# 2: execute raises; 3: an INVALID_ARG error response with the final flag.
DECOUPLED_PY = """
    import triton_python_backend_utils as pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                v = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                sender = request.get_response_sender()
                if v[0] == 2:
                    raise RuntimeError("decoupled model raised")
                if v[0] == 3:
                    err = pb_utils.TritonError("bad value 3", pb_utils.TritonError.INVALID_ARG)
                    sender.send(pb_utils.InferenceResponse(error=err), flags=FINAL)
                    continue
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", v)]))
                if v[0] == 1:
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("decoupled error")))
                sender.send(flags=FINAL)
            return None
"""

# IN 1: an error response (INTERNAL); anything else: OUT = IN.
DEFAULT_PY = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                v = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                if v[0] == 1:
                    out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("default-mode error")))
                else:
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", v)]))
            return out
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    decoupled = 'name: "dec"\nbackend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
    write_model(repo, "dec", decoupled + IO, DECOUPLED_PY)
    write_model(repo, "plain", 'name: "plain"\nbackend: "python"\nmax_batch_size: 0\n' + IO, DEFAULT_PY)
    with running_server([repo], tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv


def value(v: int) -> list[grpcclient.InferInput]:
    t = grpcclient.InferInput("IN", [1], "INT32")
    t.set_data_from_numpy(np.array([v], np.int32))
    return [t]


def run_stream(url: str, model: str, values: list[int], grpc_error: bool, settle_s: float = 1.0) -> list[Any]:
    """Send `values` on one stream; every callback as ('ok', id, OUT) or ('error', status, message)."""
    client = grpcclient.InferenceServerClient(url)
    events: queue.Queue[Any] = queue.Queue()
    headers = {"triton_grpc_error": "true"} if grpc_error else None
    client.start_stream(callback=lambda result, error: events.put((result, error)), headers=headers)
    for i, v in enumerate(values):
        client.async_stream_infer(model, value(v), request_id=str(i))
    out = []
    try:
        while True:
            result, error = events.get(timeout=settle_s)
            if error is not None:
                out.append(("error", error.status(), error.message()))
            else:
                out.append(("ok", result.get_response().id, int(result.as_numpy("OUT")[0])))
    except queue.Empty:
        pass
    client.stop_stream()
    client.close()
    return out


def test_default_mode_error_ends_the_stream_with_its_status(server: ServerProcess) -> None:
    events = run_stream(server.url, "plain", [0, 1, 0], grpc_error=True)
    assert events == [("ok", "0", 0), ("error", "StatusCode.INTERNAL", "default-mode error")]


def test_without_the_header_errors_stay_in_band(server: ServerProcess) -> None:
    events = run_stream(server.url, "plain", [0, 1, 0], grpc_error=False)
    assert events == [("ok", "0", 0), ("error", None, "default-mode error"), ("ok", "2", 0)]


def test_decoupled_error_then_final_flag_ends_the_stream(server: ServerProcess) -> None:
    events = run_stream(server.url, "dec", [1], grpc_error=True)
    assert events == [("ok", "0", 1), ("error", "StatusCode.INTERNAL", "decoupled error")]
    # the server keeps serving: a new stream (with the header) works
    assert run_stream(server.url, "dec", [0, 0], grpc_error=True) == [("ok", "0", 0), ("ok", "1", 0)]


def test_decoupled_error_codes_and_exceptions(server: ServerProcess) -> None:
    assert run_stream(server.url, "dec", [3, 0], grpc_error=True) == [
        ("error", "StatusCode.INVALID_ARGUMENT", "bad value 3")
    ]
    events = run_stream(server.url, "dec", [2], grpc_error=True)
    assert len(events) == 1 and events[0][:2] == ("error", "StatusCode.INTERNAL")
    assert "RuntimeError: decoupled model raised" in events[0][2]


def test_request_errors_end_the_stream_too(server: ServerProcess) -> None:
    events = run_stream(server.url, "no_such_model", [0], grpc_error=True)
    assert len(events) == 1 and events[0][:2] == ("error", "StatusCode.NOT_FOUND")
    assert "no_such_model" in events[0][2]
