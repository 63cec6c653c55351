"""A deterministic mock LLM: it "generates" its prompt back, one word (token) per decoding step.

It follows the tensor contract of Triton's OpenAI front end (text_input, stream, max_tokens, stop_words, ...,
text_output, num_input_tokens, num_output_tokens), is decoupled and uses dynamic batching: one execute() takes
every request that arrived together and runs them in lock-step, each step sleeping `step_seconds` once for the
whole batch and sending each streaming request its own next word. A request the client cancelled stops at the
next step (is_cancelled()).
"""

import json
import re
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
        config = json.loads(args["model_config"])
        self.step_seconds = float(config["parameters"]["step_seconds"]["string_value"])

    def execute(self, requests):
        batch = [_Sequence(r) for r in requests]
        while batch:
            time.sleep(self.step_seconds)  # one decoding step of the whole batch
            for seq in batch:
                seq.step()
            batch = [s for s in batch if not s.done]
        return None
