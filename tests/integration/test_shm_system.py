"""System shared memory through a real server, with the real tritonclient gRPC client and shm utilities."""

from __future__ import annotations

import base64
import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

from tests.conftest import ServerProcess, copy_example, running_server, shm_entries, write_model
from tests.integration.models import elementwise_py, python_config

# A model that takes 0.5 s: lets a test unregister a region while a request that uses it is running.
SLOW_MODEL = elementwise_py("x * 2", setup="time.sleep(0.5)")
SLOW_CONFIG = python_config("slow_double", max_batch_size=8)
CRASH_MODEL = """
import os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        data = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        if data[0, 0] < 0:
            os._exit(1)  # the worker dies while the request holds its shm region
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]) for _ in requests]
"""


@pytest.fixture(scope="module")
def shm_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("shm_repo")
    copy_example(repo, "add_sub", "identity_bytes", "identity_fp32_any")
    write_model(repo, "slow_double", SLOW_CONFIG, SLOW_MODEL)
    write_model(repo, "crash_on_negative", SLOW_CONFIG.replace("slow_double", "crash_on_negative"), CRASH_MODEL)
    return repo


@pytest.fixture(scope="module")
def server(shm_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server([shm_repo], tmp_path_factory.mktemp("srv") / "server.log") as proc:
        yield proc


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.unregister_system_shared_memory()
    c.close()


RegionFactory = Callable[[int], tuple[str, Any]]


@pytest.fixture
def region() -> Iterator[RegionFactory]:
    """Factory: region(byte_size) -> (key, tritonclient handle); every region is destroyed at teardown."""
    handles: list[Any] = []

    def make(byte_size: int) -> tuple[str, Any]:
        key = f"/trireme_test_{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key.lstrip("/"), key, byte_size)
        handles.append(handle)
        return key, handle

    yield make
    for h in handles:
        shm.destroy_shared_memory_region(h)


def status_code(excinfo: pytest.ExceptionInfo[InferenceServerException]) -> str:
    return str(excinfo.value.status())


def maps_key(pid: int, key: str) -> bool:
    """Whether process `pid` has the client segment `key` mapped."""
    return f"/dev/shm/{key.lstrip('/')}" in Path(f"/proc/{pid}/maps").read_text()


def shm_input(name: str, shape: list[int], datatype: str, region: str, size: int, offset: int = 0) -> Any:
    tensor = grpcclient.InferInput(name, shape, datatype)
    tensor.set_shared_memory(region, size, offset)
    return tensor


def shm_output(name: str, region: str, size: int, offset: int = 0) -> Any:
    out = grpcclient.InferRequestedOutput(name)
    out.set_shared_memory(region, size, offset)
    return out


def test_add_sub_through_input_and_output_regions(
    client: grpcclient.InferenceServerClient, region: RegionFactory
) -> None:
    # the flow of Triton's simple_grpc_shm_client.py
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 10.0, dtype=np.float32)
    in_key, in_handle = region(32)
    out_key, out_handle = region(32)
    shm.set_shared_memory_region(in_handle, [a, b])
    client.register_system_shared_memory("input_data", in_key, 32)
    client.register_system_shared_memory("output_data", out_key, 32)
    status = client.get_system_shared_memory_status(as_json=True)
    assert status["regions"]["input_data"] == {"name": "input_data", "key": in_key, "byte_size": "32"}
    assert set(status["regions"]) == {"input_data", "output_data"}

    inputs = [
        shm_input("INPUT0", [4], "FP32", "input_data", 16),
        shm_input("INPUT1", [4], "FP32", "input_data", 16, offset=16),
    ]
    outputs = [shm_output("OUTPUT0", "output_data", 16), shm_output("OUTPUT1", "output_data", 16, offset=16)]
    result = client.infer("add_sub", inputs, outputs=outputs)

    response = result.get_response()
    assert len(response.raw_output_contents) == len(response.outputs) == 2
    assert all(raw == b"" for raw in response.raw_output_contents)
    out0 = result.get_output("OUTPUT0")
    assert (out0.datatype, list(out0.shape)) == ("FP32", [4])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [4]), a + b)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [4], offset=16), a - b)

    client.unregister_system_shared_memory("input_data")
    assert set(client.get_system_shared_memory_status(as_json=True)["regions"]) == {"output_data"}
    with pytest.raises(InferenceServerException) as excinfo:
        client.get_system_shared_memory_status("input_data")
    assert status_code(excinfo) == "StatusCode.NOT_FOUND"
    assert "Unable to find system shared memory region: 'input_data'" in excinfo.value.message()
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_mixed_shm_and_raw_inputs_with_offsets(client: grpcclient.InferenceServerClient, region: RegionFactory) -> None:
    key, handle = region(8192)
    a = np.arange(4, dtype=np.float32) + 0.5
    shm.set_shared_memory_region(handle, [a], offset=4096 + 100)
    # registered window starts at 4096 inside the segment; the tensor is at offset 100 inside the window
    client.register_system_shared_memory("window", key, 2048, offset=4096)
    assert client.get_system_shared_memory_status("window", as_json=True)["regions"]["window"]["offset"] == "4096"
    b = np.ones(4, dtype=np.float32)
    in1 = grpcclient.InferInput("INPUT1", [4], "FP32")
    in1.set_data_from_numpy(b)
    inputs = [shm_input("INPUT0", [4], "FP32", "window", 16, offset=100), in1]
    outputs = [shm_output("OUTPUT0", "window", 16, offset=200), grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("add_sub", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [4], offset=4096 + 200), a + b)


def test_bytes_tensors_in_shm(client: grpcclient.InferenceServerClient, region: RegionFactory) -> None:
    values = np.array([b"alpha", b"", b"\x00\xffbinary", "unicodé".encode()], dtype=np.object_).reshape(1, 4)
    serialized = serialize_byte_tensor(values)
    size = serialized_byte_size(serialized)
    key, handle = region(256)
    shm.set_shared_memory_region(handle, [serialized])
    client.register_system_shared_memory("bytes", key, 256)
    inputs = [shm_input("INPUT0", [1, 4], "BYTES", "bytes", size)]
    outputs = [shm_output("OUTPUT0", "bytes", 256 - 128, offset=128)]
    result = client.infer("identity_bytes", inputs, outputs=outputs)
    assert list(result.get_output("OUTPUT0").shape) == [1, 4]
    got = shm.get_contents_as_numpy(handle, np.object_, [1, 4], offset=128)
    assert got.tolist() == values.tolist()

    # a length prefix that runs past the tensor's bytes is rejected before the model runs
    with pytest.raises(InferenceServerException) as excinfo:
        client.infer("identity_bytes", [shm_input("INPUT0", [1, 4], "BYTES", "bytes", size - 3)], outputs=outputs)
    assert status_code(excinfo) == "StatusCode.INVALID_ARGUMENT"
    assert "malformed BYTES data in shared memory" in excinfo.value.message()
    # fewer elements than the shape needs, trailing bytes unused
    with pytest.raises(InferenceServerException) as excinfo:
        client.infer("identity_bytes", [shm_input("INPUT0", [1, 3], "BYTES", "bytes", size)], outputs=outputs)
    assert status_code(excinfo) == "StatusCode.INVALID_ARGUMENT"


@pytest.mark.parametrize(
    "key",
    ["/a/b", "/..", "..", "/", "", "/" + "k" * 256, "/triton_python_backend_shm_region_x"],
)
def test_register_rejects_bad_keys(client: grpcclient.InferenceServerClient, key: str) -> None:
    with pytest.raises(InferenceServerException) as excinfo:
        client.register_system_shared_memory("bad", key, 16)
    assert status_code(excinfo) == "StatusCode.INVALID_ARGUMENT"
    assert "'bad'" in excinfo.value.message()
    assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_register_errors(client: grpcclient.InferenceServerClient, region: RegionFactory) -> None:
    missing = f"/trireme_test_missing_{uuid.uuid4().hex[:8]}"
    with pytest.raises(InferenceServerException) as excinfo:
        client.register_system_shared_memory("r", missing, 16)
    assert status_code(excinfo) == "StatusCode.INTERNAL"
    assert excinfo.value.message() == f"Unable to open shared memory region: '{missing}'"

    key, _ = region(64)
    for offset, size in ((0, 65), (64, 1), (2**63, 2**63)):
        with pytest.raises(InferenceServerException) as excinfo:
            client.register_system_shared_memory("r", key, size, offset=offset)
        assert status_code(excinfo) == "StatusCode.INVALID_ARGUMENT"
        assert excinfo.value.message() == "failed to register shared memory region 'r': invalid args"

    client.register_system_shared_memory("r", key, 64)
    with pytest.raises(InferenceServerException) as excinfo:
        client.register_system_shared_memory("r", key, 32)
    assert status_code(excinfo) == "StatusCode.ALREADY_EXISTS"
    assert excinfo.value.message() == "shared memory region 'r' already in manager"
    client.unregister_system_shared_memory("never-registered")  # unknown name: success
    assert set(client.get_system_shared_memory_status(as_json=True)["regions"]) == {"r"}


def test_infer_reference_errors(client: grpcclient.InferenceServerClient, region: RegionFactory) -> None:
    key, handle = region(64)
    shm.set_shared_memory_region(handle, [np.zeros(8, np.float32)])
    client.register_system_shared_memory("small", key, 64)
    b = grpcclient.InferInput("INPUT1", [4], "FP32")
    b.set_data_from_numpy(np.zeros(4, np.float32))

    def infer_code(inp: Any, outputs: list[Any] | None = None) -> tuple[str, str]:
        with pytest.raises(InferenceServerException) as excinfo:
            client.infer("add_sub", [inp, b], outputs=outputs)
        return status_code(excinfo), excinfo.value.message()

    assert infer_code(shm_input("INPUT0", [4], "FP32", "nope", 16)) == (
        "StatusCode.NOT_FOUND",
        "Unable to find shared memory region: 'nope'",
    )
    assert infer_code(shm_input("INPUT0", [4], "FP32", "small", 16, offset=64)) == (
        "StatusCode.INVALID_ARGUMENT",
        "Invalid offset for shared memory region: 'small'",
    )
    assert infer_code(shm_input("INPUT0", [4], "FP32", "small", 16, offset=56)) == (
        "StatusCode.INVALID_ARGUMENT",
        "Invalid offset + byte size for shared memory region: 'small'",
    )
    code, message = infer_code(shm_input("INPUT0", [4], "FP32", "small", 12))
    assert code == "StatusCode.INVALID_ARGUMENT" and "input byte size mismatch" in message
    good = shm_input("INPUT0", [4], "FP32", "small", 16)
    code, message = infer_code(good, [shm_output("OUTPUT0", "small", 8)])
    assert code == "StatusCode.INTERNAL"
    assert message == (
        "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should be at least "
        "16 bytes to hold the results"
    )
    # the region is still usable after all those failures (no reference leaked)
    client.infer("add_sub", [good, b])
    client.unregister_system_shared_memory("small")


def test_unregister_while_in_flight(
    server: ServerProcess, client: grpcclient.InferenceServerClient, region: RegionFactory
) -> None:
    data = np.arange(256, dtype=np.float32).reshape(1, 256)
    key, handle = region(2048)
    shm.set_shared_memory_region(handle, [data])
    client.register_system_shared_memory("busy", key, 2048)
    done: list[Any] = []
    client.async_infer(
        "slow_double",
        [shm_input("INPUT0", [1, 256], "FP32", "busy", 1024)],
        callback=lambda result, error: done.append((result, error)),
        outputs=[shm_output("OUTPUT0", "busy", 1024, offset=1024)],
    )
    deadline = 5.0

    start = time.monotonic()
    while not any(maps_key(pid, key) for pid in server.worker_pids()) and time.monotonic() - start < deadline:
        time.sleep(0.01)
    # Triton 2.73: unregistering a region in use succeeds (here over HTTP, as L0_shared_memory does); the region
    # stays listed and usable until the requests holding it are done, then goes without another unregister
    with httpclient.InferenceServerClient(server.http_url) as http:
        http.unregister_system_shared_memory()
        assert [r["name"] for r in http.get_system_shared_memory_status()] == ["busy"]
    second: list[Any] = []
    client.async_infer(
        "slow_double",
        [shm_input("INPUT0", [1, 256], "FP32", "busy", 1024)],
        callback=lambda result, error: second.append((result, error)),
        outputs=[shm_output("OUTPUT0", "busy", 1024, offset=1024)],
    )
    while not (done and second) and time.monotonic() - start < deadline + 10:
        time.sleep(0.01)
    assert [error for _result, error in [*done, *second]] == [None, None]
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [1, 256], offset=1024), data * 2)
    # once the requests are done the region is gone, and neither the server nor any worker keeps it mapped
    for _ in range(200):
        gone = client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}
        if gone and not any(maps_key(pid, key) for pid in [server.proc.pid, *server.worker_pids()]):
            break
        time.sleep(0.01)
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'busy'"):
        client.get_system_shared_memory_status("busy")
    assert not maps_key(server.proc.pid, key)
    assert not any(maps_key(pid, key) for pid in server.worker_pids())
    # the name can be registered again at once
    client.register_system_shared_memory("busy", key, 2048)


def test_worker_crash_releases_the_region(
    server: ServerProcess, client: grpcclient.InferenceServerClient, region: RegionFactory
) -> None:
    key, handle = region(64)
    shm.set_shared_memory_region(handle, [np.full((1, 4), -1.0, dtype=np.float32)])
    client.register_system_shared_memory("doomed", key, 64)
    with pytest.raises(InferenceServerException) as excinfo:
        client.infer("crash_on_negative", [shm_input("INPUT0", [1, 4], "FP32", "doomed", 16)])
    assert status_code(excinfo) == "StatusCode.UNAVAILABLE"
    assert client.get_system_shared_memory_status("doomed", as_json=True)["regions"]["doomed"]["key"] == key
    # the failed request released its reference: unregistering unmaps the segment in the server at once
    client.unregister_system_shared_memory("doomed")
    assert not maps_key(server.proc.pid, key)
    # the restarted instance serves shm requests again
    shm.set_shared_memory_region(handle, [np.ones((1, 4), dtype=np.float32)])
    client.register_system_shared_memory("doomed", key, 64)

    deadline = time.monotonic() + 30
    while True:
        try:
            result = client.infer("crash_on_negative", [shm_input("INPUT0", [1, 4], "FP32", "doomed", 16)])
            break
        except InferenceServerException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.ones((1, 4), dtype=np.float32))


def test_cuda_shared_memory_on_cpu_host(client: grpcclient.InferenceServerClient) -> None:
    pytest.importorskip("tritonclient.grpc")
    from shm.cuda import cuda_available

    if cuda_available():
        pytest.skip("checks the CPU-only answer")
    client.unregister_cuda_shared_memory()  # unregister-all succeeds without a GPU
    client.unregister_cuda_shared_memory("anything")
    assert client.get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}

    for handle in (bytes(64), b"dummy_handle"):  # a handle of the right size, and a malformed one
        with pytest.raises(InferenceServerException) as excinfo:
            client.register_cuda_shared_memory("gpu0", base64.b64encode(handle), 0, 1024)
        assert status_code(excinfo) == "StatusCode.INVALID_ARGUMENT"
        assert excinfo.value.message() == "failed to register shared memory region: invalid args"
    with pytest.raises(InferenceServerException) as excinfo:
        client.get_cuda_shared_memory_status("gpu0")
    assert status_code(excinfo) == "StatusCode.NOT_FOUND"


@pytest.mark.parametrize("args", [[], ["--allow-client-shm=false"]], ids=["default", "false"])
def test_client_shm_disabled(start_server: Any, region: RegionFactory, args: list[str]) -> None:
    """Off by default as in Triton 2.69+ (no flag at all), and with the flag false: the error names the flag."""
    server = start_server(args=args, client_shm=False)
    c = grpcclient.InferenceServerClient(server.url)
    h = httpclient.InferenceServerClient(server.http_url)
    try:
        key, _ = region(64)
        message = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
        for http_call in (
            lambda: h.register_system_shared_memory("r", key, 64),
            lambda: h.unregister_system_shared_memory(),
            lambda: h.register_cuda_shared_memory("g", b"AAAA", 0, 64),
        ):
            with pytest.raises(InferenceServerException) as excinfo:
                http_call()
            assert excinfo.value.message() == message
            assert excinfo.value.status() == "501"
        assert h.get_system_shared_memory_status() == []
        calls = [
            lambda: c.register_system_shared_memory("r", key, 64),
            lambda: c.unregister_system_shared_memory(),
            lambda: c.register_cuda_shared_memory("g", "AAAA", 0, 64),
            lambda: c.unregister_cuda_shared_memory(),
        ]
        for call in calls:
            with pytest.raises(InferenceServerException) as excinfo:
                call()
            assert status_code(excinfo) == "StatusCode.UNIMPLEMENTED"
            assert excinfo.value.message() == message
        assert c.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}
        assert c.get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}
        inp = shm_input("INPUT0", [1, 4], "FP32", "r", 16)
        with pytest.raises(InferenceServerException) as excinfo:
            c.infer("identity_fp32_any", [inp])
        assert status_code(excinfo) == "StatusCode.NOT_FOUND"
    finally:
        c.close()
        h.close()
        server.stop()
    assert not [n for n in shm_entries() if n.startswith(f"trireme_{server.proc.pid}_")]


def truncate(key: str, size: int) -> None:
    """What a misbehaving client does to its own region after registering it."""
    fd = os.open(f"/dev/shm/{key.lstrip('/')}", os.O_RDWR)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def test_truncated_region_is_refused_and_nothing_dies(
    server: ServerProcess, client: grpcclient.InferenceServerClient, region: RegionFactory
) -> None:
    key, handle = region(65536)
    shm.set_shared_memory_region(handle, [np.ones(4, np.float32)], offset=32768)
    shm.set_shared_memory_region(handle, [np.array([b"abc"], dtype=np.object_)], offset=40000)
    client.register_system_shared_memory("shrunk", key, 65536)
    b = grpcclient.InferInput("INPUT1", [4], "FP32")
    b.set_data_from_numpy(np.zeros(4, np.float32))
    far = shm_input("INPUT0", [4], "FP32", "shrunk", 16, offset=32768)
    client.infer("add_sub", [far, b])  # the worker maps the whole 64 KiB segment
    workers = sorted(server.worker_pids())
    truncate(key, 4096)

    def refused(model: str, inputs: list[Any], outputs: list[Any] | None = None) -> str:
        with pytest.raises(InferenceServerException) as excinfo:
            client.infer(model, inputs, outputs=outputs)
        assert status_code(excinfo) == "StatusCode.INVALID_ARGUMENT"
        return excinfo.value.message()

    def message(offset: int, nbytes: int) -> str:
        return (
            f"Invalid shared memory region: 'shrunk': shared memory object '{key}' holds 4096 bytes, too few for "
            f"{nbytes} bytes at offset {offset}: it was truncated after registration"
        )

    assert refused("add_sub", [far, b]) == message(32768, 16)
    bytes_in = shm_input("INPUT0", [1, 1], "BYTES", "shrunk", 7, offset=40000)  # the server parses these itself
    assert refused("identity_bytes", [bytes_in]) == message(40000, 7)
    near = shm_input("INPUT0", [4], "FP32", "shrunk", 16)
    assert refused("add_sub", [near, b], [shm_output("OUTPUT0", "shrunk", 16, offset=49152)]) == message(49152, 16)
    # the part that is still there serves, from the same workers and server
    shm.set_shared_memory_region(handle, [np.full(4, 2.0, np.float32)])
    out = client.infer("add_sub", [near, b], outputs=[shm_output("OUTPUT0", "shrunk", 16, offset=1024)])
    assert out.get_output("OUTPUT0") is not None
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [4], offset=1024), np.full(4, 2.0))
    assert server.proc.poll() is None
    assert sorted(server.worker_pids()) == workers
    client.unregister_system_shared_memory("shrunk")


def test_a_region_whose_key_was_unlinked_keeps_serving(
    server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    """Create, register, unlink (so nothing leaks if the client dies): Triton keeps serving the region, as the
    server mapped it; so must the worker, which maps it later (it opens the object the server registered)."""
    key = f"/trireme_test_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(key.lstrip("/"), key, 64)
    try:
        shm.set_shared_memory_region(handle, [np.arange(4, dtype=np.float32)])
        client.register_system_shared_memory("unlinked", key, 64)
        os.unlink(f"/dev/shm/{key.lstrip('/')}")
        b = grpcclient.InferInput("INPUT1", [4], "FP32")
        b.set_data_from_numpy(np.ones(4, np.float32))
        inputs = [shm_input("INPUT0", [4], "FP32", "unlinked", 16), b]
        client.infer("add_sub", inputs, outputs=[shm_output("OUTPUT0", "unlinked", 16, offset=32)])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [4], offset=32), np.arange(4) + 1)
        client.unregister_system_shared_memory("unlinked")
    finally:
        with contextlib.suppress(Exception):
            shm.destroy_shared_memory_region(handle)
