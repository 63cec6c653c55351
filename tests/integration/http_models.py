"""The model repository the HTTP tests serve: the tutorial's `linear` model, a decoupled word streamer, a
sequence counter, a parameter echo, a classifier with labels, and copies of the example models."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import copy_example, write_model
from tests.integration.models import elementwise_py, python_config

LINEAR_CONFIG = python_config("linear", [("INPUT0", "TYPE_FP32", [3, 3])], [("OUTPUT0", "TYPE_FP32", [3, 3])])

# OUTPUT0 = 2 * INPUT0 + 1
LINEAR_PY = elementwise_py("2 * x + 1")

WORDS_CONFIG = """
name: "words"
backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""

# decoupled: one response per word of text_input (upper-cased), then the final flag alone; "fail" errors
WORDS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0].decode()
            sender = request.get_response_sender()
            for word in text.split():
                if word == "fail":
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("the model failed")))
                    continue
                out = np.array([word.upper().encode()], dtype=object)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", out)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

PARAMS_CONFIG = """
name: "params"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# returns the request's parameters (JSON) and sets a response parameter
PARAMS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            text = np.array([request.parameters().encode()], dtype=object)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("PARAMS", text)], parameters={"echoed": True}))
        return out
"""

COUNTER_CONFIG = """
name: "counter"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
}
"""

# running sum per sequence, reset on START
COUNTER_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.total = 0

    def execute(self, requests):
        out = []
        for request in requests:
            if pb_utils.get_input_tensor_by_name(request, "START").as_numpy()[0]:
                self.total = 0
            self.total += int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([self.total], np.int32))]))
        return out
"""


TICKER_CONFIG = """
name: "ticker"
backend: "python"
max_batch_size: 0
input [ { name: "MARKER" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "TICK" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""

# decoupled: a response every 20 ms for up to 20 s; once the request is cancelled it writes the number of
# responses it sent into the file named by MARKER and stops
TICKER_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            marker = pb_utils.get_input_tensor_by_name(request, "MARKER").as_numpy()[0].decode()
            sender = request.get_response_sender()
            for i in range(1000):
                if request.is_cancelled():
                    with open(marker, "w") as f:
                        f.write(str(i))
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("TICK", np.array([i], np.int32))]))
                time.sleep(0.02)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def build_repo(repo: Path) -> Path:
    """Write every model the HTTP tests use into `repo`."""
    write_model(repo, "linear", LINEAR_CONFIG, LINEAR_PY)
    write_model(repo, "words", WORDS_CONFIG, WORDS_PY)
    write_model(repo, "params", PARAMS_CONFIG, PARAMS_PY)
    write_model(repo, "counter", COUNTER_CONFIG, COUNTER_PY)
    write_model(repo, "ticker", TICKER_CONFIG, TICKER_PY)
    copy_example(repo, "add_sub", "identity_bytes", "identity_fp32_any")
    return repo
