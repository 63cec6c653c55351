"""Zero copy: an input in a registered system region reaches the model's execute without being copied."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from tests.conftest import ServerProcess, write_model
from tests.integration.models import python_config

# Returns the first 4 input values, then writes -1 into the input's first element: when the model's array is
# the client's own memory, the client sees that write in its region.
PROBE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            data = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            head = data[:, :4].copy()
            data[0, 0] = -1.0
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", head)]))
        return responses
"""
PROBE_CONFIG = python_config("probe", max_batch_size=8)
SIZE = 64 << 20
COUNT = SIZE // 4
LOG_LINE = re.compile(
    r"input copies: model 'probe' request '(?P<id>[^']*)': (?P<copied>\d+) bytes copied to the worker, "
    r"(?P<inplace>\d+) bytes read in place"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("zc_repo")
    write_model(repo, "probe", PROBE_CONFIG, PROBE_MODEL)
    proc = ServerProcess([repo], ["--log-verbose=1"], tmp_path_factory.mktemp("srv") / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def copies(server: ServerProcess, request_id: str) -> tuple[int, int]:
    """(bytes copied to the worker, bytes read in place) that the server logged for one request."""
    for m in LOG_LINE.finditer(server.log()):
        if m["id"] == request_id:
            return int(m["copied"]), int(m["inplace"])
    raise AssertionError(f"no copy accounting logged for request {request_id}")


def test_64mib_input_through_a_registered_region_is_not_copied(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    key = f"/trireme_test_zc_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(key.lstrip("/"), key, SIZE)
    try:
        data = np.arange(COUNT, dtype=np.float32).reshape(1, COUNT)
        shm.set_shared_memory_region(handle, [data])
        client.register_system_shared_memory("big", key, SIZE)
        inp = grpcclient.InferInput("INPUT0", [1, COUNT], "FP32")
        inp.set_shared_memory("big", SIZE)
        result = client.infer("probe", [inp], request_id="zc-shm")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data[:, :4])
        # the model wrote into the very memory the client registered: no copy stood between them
        assert shm.get_contents_as_numpy(handle, np.float32, [4])[0] == -1.0
        assert copies(server, "zc-shm") == (0, SIZE)

        # the same 64 MiB sent inline is copied once into the worker's arena (and the model's write stays there)
        shm.set_shared_memory_region(handle, [data])
        raw = grpcclient.InferInput("INPUT0", [1, COUNT], "FP32")
        raw.set_data_from_numpy(data)
        result = client.infer("probe", [raw], request_id="zc-raw")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data[:, :4])
        assert shm.get_contents_as_numpy(handle, np.float32, [4])[0] == 0.0
        assert copies(server, "zc-raw") == (SIZE, 0)
    finally:
        client.unregister_system_shared_memory()
        client.close()
        shm.destroy_shared_memory_region(handle)
    assert not Path("/dev/shm", key.lstrip("/")).exists()
