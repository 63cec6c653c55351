"""Steady client load for model-lifecycle tests and benchmarks: unary and streaming clients calling one model
back to back, every request's send/receive time and answer recorded, so lost or failed requests and the moment
responses switch to a reloaded model's behaviour can be checked afterwards.

The model under load answers OUTPUT0 = [tag, instance index, worker pid] (see TAGGED_MODEL).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

REQUEST_TIMEOUT_S = 60.0

TAGGED_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
parameters {{ key: "tag" value: {{ string_value: "{param_tag}" }} }}
{extra}
"""

# tag = TAG (in the code) + the config parameter "tag"; INPUT0 is a sleep in seconds.
TAGGED_MODEL = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

TAG = {tag}


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.tag = TAG + float(config["parameters"]["tag"]["string_value"])
        self.index = float(args["model_instance_name"].rsplit("_", 1)[1])

    def execute(self, requests):
        out = []
        for request in requests:
            delay = float(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            if delay:
                time.sleep(delay)
            value = np.array([self.tag, self.index, os.getpid()], np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]))
        return out
"""


def tagged_config(name: str, count: int = 1, param_tag: float = 0, extra: str = "") -> str:
    """config.pbtxt of a tagged model."""
    return TAGGED_CONFIG.format(name=name, count=count, param_tag=param_tag, extra=extra)


def tagged_model(tag: float) -> str:
    """model.py of a tagged model whose code adds `tag`."""
    return TAGGED_MODEL.format(tag=tag)


@dataclass(slots=True)
class Outcome:
    """One request: when it was sent and answered, and its answer (or error text)."""

    sent: float
    done: float
    value: tuple[float, float, float] | None
    error: str = ""
    stream: bool = False


@dataclass
class SteadyLoad:
    """`unary` + `streams` client threads calling `model` back to back until stop()."""

    url: str
    model: str
    unary: int = 3
    streams: int = 1
    delay_s: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    sent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Condition = field(default_factory=threading.Condition)

    def _inputs(self) -> list[grpcclient.InferInput]:
        x = grpcclient.InferInput("INPUT0", [1], "FP32")
        x.set_data_from_numpy(np.array([self.delay_s], np.float32))
        return [x]

    def _record(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)
            self._lock.notify_all()

    def _count_sent(self) -> None:
        with self._lock:
            self.sent += 1

    def _unary(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        try:
            while not self._stop.is_set():
                self._count_sent()
                t0 = time.monotonic()
                try:
                    r = client.infer(self.model, self._inputs(), client_timeout=REQUEST_TIMEOUT_S)
                    v = r.as_numpy("OUTPUT0")
                    self._record(Outcome(t0, time.monotonic(), (float(v[0]), float(v[1]), float(v[2]))))
                except InferenceServerException as e:
                    self._record(Outcome(t0, time.monotonic(), None, str(e)))
        finally:
            client.close()

    def _stream(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        answers: queue.Queue[tuple[object, object]] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            while not self._stop.is_set():
                self._count_sent()
                t0 = time.monotonic()
                client.async_stream_infer(self.model, self._inputs())
                try:
                    result, error = answers.get(timeout=REQUEST_TIMEOUT_S)
                except queue.Empty:
                    self._record(Outcome(t0, time.monotonic(), None, "lost: no answer on the stream", True))
                    return
                if error is not None:
                    self._record(Outcome(t0, time.monotonic(), None, str(error), True))
                else:
                    v = result.as_numpy("OUTPUT0")  # type: ignore[attr-defined]
                    self._record(Outcome(t0, time.monotonic(), (float(v[0]), float(v[1]), float(v[2])), "", True))
        finally:
            client.stop_stream()
            client.close()

    def start(self) -> SteadyLoad:
        """Start the client threads."""
        for target, n in ((self._unary, self.unary), (self._stream, self.streams)):
            for _ in range(n):
                t = threading.Thread(target=target, daemon=True)
                t.start()
                self._threads.append(t)
        return self

    def wait_answers(self, n: int, timeout_s: float = 60.0) -> None:
        """Block until at least n more answers than now have arrived."""
        with self._lock:
            target = len(self.outcomes) + n
            if not self._lock.wait_for(lambda: len(self.outcomes) >= target, timeout_s):
                raise TimeoutError(f"only {len(self.outcomes)} of {target} answers after {timeout_s} s")

    def stop(self) -> list[Outcome]:
        """Stop the clients (each finishes its request in flight) and return every outcome."""
        self._stop.set()
        for t in self._threads:
            t.join(REQUEST_TIMEOUT_S + 5)
        return list(self.outcomes)

    def failures(self) -> list[Outcome]:
        """Requests answered with an error."""
        return [o for o in self.outcomes if o.error]

    def lost(self) -> int:
        """Requests sent but never answered."""
        return self.sent - len(self.outcomes)


def served_between(outcomes: list[Outcome], t0: float, t1: float) -> int:
    """Successful requests answered in [t0, t1]."""
    return sum(1 for o in outcomes if o.value is not None and t0 <= o.done <= t1)
