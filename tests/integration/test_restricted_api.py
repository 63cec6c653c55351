"""--grpc-restricted-protocol / --http-restricted-api: every RPC and path of every API group needs its group's
header; without it the call gets Triton's answer (gRPC UNAVAILABLE "This protocol is restricted, expecting header
'...'", HTTP 403 {"error": "This API is restricted, expecting header '...'"})."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from tests.conftest import EXAMPLE_REPO, ServerProcess, running_server

GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
# every RPC of each group with a request it accepts (or answers with an error of its own)
CALLS: dict[str, list[tuple[str, Any]]] = {
    "health": [
        ("ServerLive", pb.ServerLiveRequest()),
        ("ServerReady", pb.ServerReadyRequest()),
        ("ModelReady", pb.ModelReadyRequest(name="identity_fp32")),
    ],
    "metadata": [
        ("ServerMetadata", pb.ServerMetadataRequest()),
        ("ModelMetadata", pb.ModelMetadataRequest(name="identity_fp32")),
    ],
    "inference": [("ModelInfer", pb.ModelInferRequest(model_name="no_such_model"))],
    "shared-memory": [
        ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest()),
        ("SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(name="r", key="/no_such", byte_size=4)),
        ("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name="r")),
        ("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest()),
        ("CudaSharedMemoryRegister", pb.CudaSharedMemoryRegisterRequest(name="c", byte_size=4)),
        ("CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest(name="c")),
    ],
    "model-config": [("ModelConfig", pb.ModelConfigRequest(name="identity_fp32"))],
    "model-repository": [
        ("RepositoryIndex", pb.RepositoryIndexRequest()),
        ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="identity_fp32")),
        ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="no_such_model")),
    ],
    "statistics": [("ModelStatistics", pb.ModelStatisticsRequest())],
    "trace": [("TraceSetting", pb.TraceSettingRequest())],
    "logging": [("LogSettings", pb.LogSettingsRequest())],
}


def _header(group: str) -> str:
    return f"triton-grpc-protocol-key-{group}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = [f"--grpc-restricted-protocol={g}:key-{g}=secret-{g}" for g in GROUPS]
    args += [f"--http-restricted-api={g}:key-{g}=secret-{g}" for g in GROUPS]
    log = tmp_path_factory.mktemp("srv") / "server.log"
    with running_server([EXAMPLE_REPO], log, [*args, "--model-control-mode=explicit", "--load-model=*"]) as s:
        yield s


def _call(rpc: Callable[..., Any], request: Any, metadata: Any = None) -> tuple[grpc.StatusCode, str]:
    try:
        rpc(request, metadata=metadata)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def _restricted(group: str) -> tuple[grpc.StatusCode, str]:
    return grpc.StatusCode.UNAVAILABLE, f"This protocol is restricted, expecting header '{_header(group)}'"


@pytest.mark.parametrize("group", GROUPS)
def test_every_rpc_of_the_group_needs_its_header(server: ServerProcess, group: str) -> None:
    other = GROUPS[(GROUPS.index(group) + 1) % len(GROUPS)]
    with grpc.insecure_channel(server.url) as channel:
        for method, request in CALLS[group]:
            rpc = channel.unary_unary(
                f"/inference.GRPCInferenceService/{method}",
                request_serializer=type(request).SerializeToString,
                response_deserializer=lambda b: b,
            )
            wrong_value = [(_header(group), "wrong")]
            other_group = [(_header(other), f"secret-{other}")]
            for metadata in (None, wrong_value, other_group):
                assert _call(rpc, request, metadata) == _restricted(group), (method, metadata)
            code, message = _call(rpc, request, [(_header(group), f"secret-{group}")])
            assert "This protocol is restricted" not in message, (method, code, message)
        if group == "health":
            check = channel.unary_unary("/grpc.health.v1.Health/Check")
            assert _call(check, b"") == _restricted(group)
            assert _call(check, b"", [(_header(group), "secret-health")]) == (grpc.StatusCode.OK, "")


INFER_BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}
HTTP_CALLS: dict[str, list[tuple[str, str, Any]]] = {
    "health": [
        ("GET", "/v2/health/live", None),
        ("GET", "/v2/health/ready", None),
        ("GET", "/v2/models/identity_fp32/ready", None),
        ("GET", "/v2/models/identity_fp32/versions/1/ready", None),
    ],
    "metadata": [("GET", "/v2", None), ("GET", "/v2/models/identity_fp32", None)],
    "inference": [("POST", "/v2/models/identity_fp32/infer", INFER_BODY)],
    "shared-memory": [
        ("GET", "/v2/systemsharedmemory/status", None),
        ("GET", "/v2/cudasharedmemory/status", None),
        ("POST", "/v2/systemsharedmemory/unregister", None),
        ("POST", "/v2/cudasharedmemory/unregister", None),
    ],
    "model-config": [("GET", "/v2/models/identity_fp32/config", None)],
    "model-repository": [
        ("POST", "/v2/repository/index", None),
        ("POST", "/v2/repository/models/no_such_model/unload", None),
    ],
    "statistics": [("GET", "/v2/models/stats", None), ("GET", "/v2/models/identity_fp32/stats", None)],
    "trace": [("GET", "/v2/trace/setting", None)],
    "logging": [("GET", "/v2/logging", None)],
}


@pytest.mark.parametrize("group", GROUPS)
def test_every_http_path_of_the_group_needs_its_header(server: ServerProcess, group: str) -> None:
    other = GROUPS[(GROUPS.index(group) + 1) % len(GROUPS)]
    for method, path, body in HTTP_CALLS[group]:
        url = f"http://{server.http_url}{path}"
        for headers in (None, {f"key-{group}": "wrong"}, {f"key-{other}": f"secret-{other}"}):
            r = requests.request(method, url, json=body, headers=headers, timeout=30)
            assert r.status_code == 403, (path, headers)
            assert r.json() == {"error": f"This API is restricted, expecting header 'key-{group}'"}
        r = requests.request(method, url, json=body, headers={f"key-{group}": f"secret-{group}"}, timeout=30)
        assert r.status_code != 403 and "restricted" not in r.text, (path, r.status_code, r.text)


def _put(results: queue.Queue[Any], result: Any, error: Any) -> None:
    results.put(error or result)


def test_stream_needs_the_inference_header(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    x = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    for headers, restricted in ((None, True), ({_header("inference"): "secret-inference"}, False)):
        results: queue.Queue[Any] = queue.Queue()
        client.start_stream(partial(_put, results), headers=headers)
        try:
            client.async_stream_infer("identity_fp32", [x])
        except InferenceServerException:
            assert restricted  # the stream already ended with the restriction error, reported to the callback
        got = results.get(timeout=20)
        client.stop_stream()
        if restricted:
            assert isinstance(got, InferenceServerException)
            assert got.message() == _restricted("inference")[1]
        else:
            np.testing.assert_array_equal(got.as_numpy("OUTPUT0"), np.ones((1, 16), np.float32))
    client.close()


def test_a_production_setup(start_server) -> None:  # type: ignore[no-untyped-def]
    """Inference open, shared memory and model control behind one admin key (docs/security.md)."""
    server = start_server(args=["--grpc-restricted-protocol=shared-memory,model-repository:admin-key=s3cret"])
    client = grpcclient.InferenceServerClient(server.url)
    x = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    assert client.infer("identity_fp32", [x]).as_numpy("OUTPUT0").shape == (1, 16)
    for call in (client.get_system_shared_memory_status, client.get_model_repository_index):
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        assert info.value.message() == "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
    admin = {"triton-grpc-protocol-admin-key": "s3cret"}
    assert client.get_system_shared_memory_status(headers=admin).regions == {}
    assert any(m.name == "identity_fp32" for m in client.get_model_repository_index(headers=admin).models)
    client.close()
