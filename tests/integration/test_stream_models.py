"""Model sources (written as for Triton's Python backend) used by the streaming, decoupled, sequence and
cancellation tests; the repositories are generated at test time. This module holds no tests."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import write_model

# Like Triton's repeat_int32 example: every element of IN becomes one response (after DELAY ms), then a
# final flag alone; the responses are sent from a thread started by execute, which returns at once.
REPEAT_CONFIG = """
name: "repeat_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
instance_group [{ count: 1 kind: KIND_CPU }]
"""

REPEAT_PY = """
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException("repeat_int32 must be decoupled")
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
            if values.shape != delays.shape:
                request.get_response_sender().send(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("IN and DELAY shape mismatch")
                    ),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            t = threading.Thread(target=self.respond, args=(request.get_response_sender(), values, delays, wait))
            t.daemon = True
            t.start()
            self.threads.append(t)
        return None

    def respond(self, sender, values, delays, wait):
        for idx, (value, delay) in enumerate(zip(values, delays)):
            time.sleep(delay / 1000.0)
            out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
            index = pb_utils.Tensor("IDX", np.array([idx], dtype=np.uint32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out, index]))
        time.sleep(wait[0] / 1000.0)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for t in self.threads:
            t.join(timeout=5)
"""

# Like Triton's square_int32 example: IN = n gives n responses carrying n, sent from a thread.
SQUARE_CONFIG = """
name: "square_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }]
"""

SQUARE_PY = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.inflight = 0
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self.run, args=(sender, n), daemon=True).start()
        return None

    def run(self, sender, n):
        for _ in range(n):
            out = pb_utils.Tensor("OUT", np.array([n], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# A non-decoupled model that sleeps DELAY ms, returns INPUT0 as OUTPUT0 and appends a line per request to
# a log file named by the config parameter LOG: "<value> cancelled=<request.is_cancelled()>".
SLOW_CONFIG = """
name: "slow_identity"
backend: "python"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }]
instance_group [{ count: 1 kind: KIND_CPU }]
parameters { key: "LOG" value { string_value: "%s" } }
"""

SLOW_PY = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = json.loads(args["model_config"])["parameters"]["LOG"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            delay = int(pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()[0])
            deadline = time.monotonic() + delay / 1000.0
            while time.monotonic() < deadline and not request.is_cancelled():
                time.sleep(0.01)
            with open(self.log, "a") as f:
                f.write(f"{int(value[0])} cancelled={request.is_cancelled()}\\n")
            if value[0] < 0:
                error = pb_utils.TritonError(f"negative input {int(value[0])}", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]))
        return responses
"""

# A stateful accumulator for the sequence batcher, written as Triton's Python models are: it keeps one
# running sum per correlation id, reads START/END/READY/CORRID control inputs, and answers
# OUTPUT = sum so far (START resets). Padding requests (READY=0) are answered with zeros.
ACCUMULATE_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        self.batching = self.config["max_batch_size"] > 0
        self.sums = {}
        self.log = self.config["parameters"]["LOG"]["string_value"] if "LOG" in self.config["parameters"] else ""

    def value(self, request, name):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy().reshape(-1)[0]

    def execute(self, requests):
        responses = []
        lines = []
        for request in requests:
            x = int(self.value(request, "INPUT"))
            start, end, ready = self.value(request, "START"), self.value(request, "END"), self.value(request, "READY")
            corrid = self.value(request, "CORRID")
            if isinstance(corrid, bytes):
                corrid = corrid.decode()
            else:
                corrid = int(corrid)
            if corrid != request.correlation_id():
                raise pb_utils.TritonModelException(f"CORRID {corrid!r} != {request.correlation_id()!r}")
            lines.append(f"batch={len(requests)} corrid={corrid} x={x} start={start} end={end} ready={ready}")
            if not ready:
                responses.append(pb_utils.InferenceResponse([self.out(0)]))
                continue
            total = (0 if start else self.sums.get(corrid, 0)) + x
            self.sums[corrid] = total
            if end:
                self.sums.pop(corrid, None)
            responses.append(pb_utils.InferenceResponse([self.out(total)]))
        if self.log:
            with open(self.log, "a") as f:
                f.write("\\n".join(lines) + "\\n")
        return responses

    def out(self, v):
        shape = [1, 1] if self.batching else [1]
        wrapped = (v + 2**31) % 2**32 - 2**31  # int32 overflow wraps, as in C
        return pb_utils.Tensor("OUTPUT", np.full(shape, wrapped, dtype=np.int32))
"""


def accumulate_config(
    name: str,
    max_batch_size: int,
    strategy: str = "direct { }",
    corrid_type: str = "TYPE_UINT64",
    idle_us: int = 5_000_000,
    log: str = "",
    instances: int = 1,
) -> str:
    """Config of an accumulator model with the four control inputs."""
    params = f'parameters {{ key: "LOG" value {{ string_value: "{log}" }} }}' if log else ""
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  control_input [
    {{ name: "START" control [{{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }}] }},
    {{ name: "END" control [{{ kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] }}] }},
    {{ name: "READY" control [{{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }}] }},
    {{ name: "CORRID" control [{{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }}] }}
  ]
}}
input [{{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }}]
output [{{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }}]
instance_group [{{ count: {instances} kind: KIND_CPU }}]
{params}
"""


# Implicit state: the server keeps STATE_IN per sequence; the model adds INPUT to it and returns the new
# value both as OUTPUT and as STATE_OUT (which becomes the next request's STATE_IN).
STATEFUL_CONFIG = """
name: "implicit_state"
backend: "python"
max_batch_size: 0
sequence_batching {
  control_input [
    { name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }] }
  ]
  state [{
    input_name: "STATE_IN"
    output_name: "STATE_OUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
    initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" }
  }]
}
input [{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }]
"""

STATEFUL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy()
            total = (state + x).astype(np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("STATE_OUT", total)]
                )
            )
        return responses
"""


def write_repeat(repo: Path) -> None:
    """repeat_int32 into `repo`."""
    write_model(repo, "repeat_int32", REPEAT_CONFIG, REPEAT_PY)


def write_square(repo: Path) -> None:
    """square_int32 into `repo`."""
    write_model(repo, "square_int32", SQUARE_CONFIG, SQUARE_PY)


def write_slow(repo: Path, log: Path) -> None:
    """slow_identity into `repo`, logging executions to `log`."""
    write_model(repo, "slow_identity", SLOW_CONFIG % log, SLOW_PY)
