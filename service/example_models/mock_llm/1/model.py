"""A deterministic mock LLM: it "generates" its prompt back, one word (token) per decoding step.

It follows the tensor contract of Triton's OpenAI front end (text_input, stream, max_tokens, stop_words, ...,
text_output, num_input_tokens, num_output_tokens), is decoupled and uses dynamic batching: one execute() takes
every request that arrived together. Each decoding step sleeps `step_seconds` once for all the sequences it
advances (as a GPU step costs about the same for 1 or 32 sequences) and sends each streaming request its own next
word. A request the client cancelled stops at the next step (is_cancelled()).

Two ways to run a batch (config parameter `inflight_batching`):
* "false": execute() generates its batch to the end, then returns (static batching: requests that arrive
  meanwhile wait for the next execute);
* "true": execute() hands its batch to one background generation loop and returns at once; sequences of later
  executes join the running loop at its next step (in-flight batching, as LLM engines do).
"""

import json
import re
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

WORD = re.compile(r"\s*\S+")  # a "token": a word with the whitespace before it


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


class _Sequence:
    """One request being generated."""

    def __init__(self, request):
        self.request = request
        self.sender = request.get_response_sender()
        prompt = _scalar(request, "text_input", b"")
        prompt = prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else str(prompt)
        self.prompt_tokens = WORD.findall(prompt)
        self.stream = bool(_scalar(request, "stream", False))
        self.max_tokens = int(_scalar(request, "max_tokens", 16))
        stops = pb_utils.get_input_tensor_by_name(request, "stop_words")
        stops = stops.as_numpy().reshape(-1) if stops is not None else []
        self.stops = [s.decode() if isinstance(s, bytes) else str(s) for s in stops if s]
        self.text = ""
        self.count = 0
        self.done = False

    def _respond(self, text, tokens, final):
        outputs = [
            pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=np.object_)),
            pb_utils.Tensor("num_input_tokens", np.array([[len(self.prompt_tokens)]], dtype=np.uint32)),
            pb_utils.Tensor("num_output_tokens", np.array([[tokens]], dtype=np.uint32)),
        ]
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        self.sender.send(pb_utils.InferenceResponse(outputs), flags=flags)

    def step(self):
        """Generate the next token; finish when the prompt, max_tokens or a stop word ends the sequence."""
        if self.request.is_cancelled():
            self.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            self.done = True
            return
        token = self.prompt_tokens[self.count] if self.count < len(self.prompt_tokens) else None
        stopped = False
        if token is not None:  # a stop word ends the text just before it
            at = min(((self.text + token).find(s) for s in self.stops if s in self.text + token), default=-1)
            if at >= 0:
                token, stopped = (self.text + token)[len(self.text) : at], True
        if token:
            self.count += 1
            self.text += token
            if self.stream:
                self._respond(token, 1, False)
        if token is None or stopped or self.count >= self.max_tokens:
            self.done = True
            if self.stream:
                self.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                self._respond(self.text, self.count, True)


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.step_seconds = float(params["step_seconds"]["string_value"])
        self.inflight = params.get("inflight_batching", {}).get("string_value", "false").lower() == "true"
        self._active = []  # in-flight mode: every sequence being generated, whichever execute brought it
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        if self.inflight:
            self._loop = threading.Thread(target=self._generate_forever, daemon=True)
            self._loop.start()

    def execute(self, requests):
        batch = [_Sequence(r) for r in requests]
        if self.inflight:  # hand the batch to the generation loop; execute returns at once
            with self._lock:
                self._active.extend(batch)
                self._wake.set()
            return None
        while batch:  # the batch of this execute, in lock-step, until its last sequence ends
            time.sleep(self.step_seconds)  # one decoding step of the whole batch
            for seq in batch:
                seq.step()
            batch = [s for s in batch if not s.done]
        return None

    def _generate_forever(self):
        """In-flight batching: one decoding step at a time over every active sequence; new ones join at once."""
        while True:
            self._wake.wait()
            if self._stopping:
                return
            with self._lock:
                batch = list(self._active)
            time.sleep(self.step_seconds)
            for seq in batch:
                seq.step()
            with self._lock:
                self._active = [s for s in self._active if not s.done]
                if not self._active:
                    self._wake.clear()

    def finalize(self):
        self._stopping = True
        self._wake.set()
