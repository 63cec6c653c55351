"""BYTES outputs built from non-bytes objects serialize as in Triton's Python backend: `bytes` as is, any other
object as str(x) in UTF-8 (Triton's `simple_string` model returns `out.astype(np.object_)` of int32 sums).

Checked on every path: worker-process and in-process instances, BLS (as a request input and as a reply),
gRPC, HTTP and a system shared-memory output region (whose size check must see the same bytes)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import serialize_byte_tensor

from tests.conftest import ServerProcess, running_server, write_model

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_STRING dims: [ -1 ] }}
]
{extra}
"""

# OUTPUT0: the int32 input as an object array; OUTPUT1: one element of each object type Triton accepts
OBJECTS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

MIXED = [1, -1, 2.5, True, "\\u00e9", b"\\x00x", None, np.bytes_(b"nb"), bytearray(b"ba"), np.float32(1.5),
         np.int64(-7)]

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x.astype(np.object_)),
                pb_utils.Tensor("OUTPUT1", np.array(MIXED, dtype=np.object_)),
            ]))
        return out
"""

# BLS: sends the ints as an object array to `bytes_echo` (a BYTES input) and returns what came back, plus what
# the `objects` model answered to a plain call
CALLER_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            echo = pb_utils.InferenceRequest(
                model_name="bytes_echo", inputs=[pb_utils.Tensor("INPUT0", x.astype(np.object_))],
                requested_output_names=["OUTPUT0"]).exec()
            objs = pb_utils.InferenceRequest(
                model_name="objects", inputs=[pb_utils.Tensor("INPUT0", x)],
                requested_output_names=["OUTPUT1"]).exec()
            if echo.has_error() or objs.has_error():
                raise pb_utils.TritonModelException("BLS failed")
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", pb_utils.get_output_tensor_by_name(echo, "OUTPUT0").as_numpy()),
                pb_utils.Tensor("OUTPUT1", pb_utils.get_output_tensor_by_name(objs, "OUTPUT1").as_numpy()),
            ]))
        return out
"""

ECHO_CONFIG = """
name: "bytes_echo"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
ECHO_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

IN_PROCESS = 'parameters { key: "TRIREME_INSTANCE_MODE" value: { string_value: "in_process" } }'
INTS = np.array([2, -1, 300], dtype=np.int32)
EXPECTED0 = [b"2", b"-1", b"300"]
# what Triton 2.51 answers for OBJECTS_PY's MIXED (measured)
EXPECTED1 = [b"1", b"-1", b"2.5", b"True", "\u00e9".encode(), b"\x00x", b"None", b"b'nb'", b"bytearray(b'ba')",
             b"1.5", b"-7"]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("bytes_repo")
    write_model(repo, "objects", CONFIG.format(name="objects", extra=""), OBJECTS_PY)
    write_model(repo, "objects_ip", CONFIG.format(name="objects_ip", extra=IN_PROCESS), OBJECTS_PY)
    write_model(repo, "objects_bls", CONFIG.format(name="objects_bls", extra=""), CALLER_PY)
    write_model(repo, "bytes_echo", ECHO_CONFIG, ECHO_PY)
    with running_server([repo], tmp_path_factory.mktemp("srv") / "server.log") as proc:
        yield proc


@pytest.mark.parametrize("model", ["objects", "objects_ip", "objects_bls"])
def test_grpc_objects_serialize_as_str(server: ServerProcess, model: str) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    inp = grpcclient.InferInput("INPUT0", [3], "INT32")
    inp.set_data_from_numpy(INTS)
    result = client.infer(model, [inp])
    assert result.as_numpy("OUTPUT0").tolist() == EXPECTED0
    assert result.as_numpy("OUTPUT1").tolist() == EXPECTED1
    client.close()


@pytest.mark.parametrize("binary", [True, False])
def test_http_objects_serialize_as_str(server: ServerProcess, binary: bool) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("INPUT0", [3], "INT32")
    inp.set_data_from_numpy(INTS)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    result = client.infer("objects", [inp], outputs=outputs)
    assert [v if isinstance(v, bytes) else v.encode() for v in result.as_numpy("OUTPUT0").tolist()] == EXPECTED0
    client.close()


def test_system_shm_output_holds_the_str_bytes(server: ServerProcess) -> None:
    expected = serialize_byte_tensor(np.array(EXPECTED0, dtype=np.object_)).item()
    key = f"/trireme_test_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(key.lstrip("/"), key, 64)
    client = grpcclient.InferenceServerClient(server.url)
    try:
        client.register_system_shared_memory("objs_out", key, 64)
        inp = grpcclient.InferInput("INPUT0", [3], "INT32")
        inp.set_data_from_numpy(INTS)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("objs_out", len(expected))  # exactly the size of the str serialization
        client.infer("objects", [inp], outputs=[out])
        got = shm.get_contents_as_numpy(handle, np.object_, [3])
        assert got.tolist() == EXPECTED0
    finally:
        client.unregister_system_shared_memory()
        client.close()
        shm.destroy_shared_memory_region(handle)
