"""Model repository and server for the OpenAI API tests: the mock_llm example (faster steps), a copy without
batching, a mock embedding model, and a tokenizer folder whose chat template is just the last message."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import EXAMPLE_REPO, ROOT, ServerProcess, free_port, running_server, write_model

EMBEDDING_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            # a deterministic 8-dim vector: byte sums of the text at 8 strides, L2-normalized
            raw = np.frombuffer(text, np.uint8).astype(np.float32)
            vec = np.array([raw[i::8].sum() + 1 for i in range(8)], np.float32)
            vec /= np.linalg.norm(vec)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("embedding", vec.reshape(1, 8)),
                pb_utils.Tensor("num_input_tokens", np.array([[len(text.split())]], np.uint32)),
            ]))
        return out
"""


FAIL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.Tensor("text_output", np.array([b"partial"], dtype=np.object_))
            sender.send(pb_utils.InferenceResponse([text]))
            error = pb_utils.TritonError("the mock failed on purpose", pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


VLLM_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _get(request, name, default):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return default if t is None else t.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    \"\"\"vLLM's tensor format: the sampling fields arrive as JSON; answers the first max_tokens words of the prompt,
    with vLLM-style logprobs when asked (the k-th word gets logprob -k/10).\"\"\"

    def execute(self, requests):
        for request in requests:
            sampling = json.loads(_get(request, "sampling_parameters", b"{}"))
            words = _get(request, "text_input", b"").decode().split()[: sampling["max_tokens"]]
            outputs = [pb_utils.Tensor("text_output", np.array([" ".join(words).encode()], dtype=np.object_))]
            if _get(request, "return_logprobs", False):
                top = sampling.get("logprobs", 1)
                logprobs = [
                    {str(r): {"logprob": -k / 10 - r, "rank": r + 1, "decoded_token": w if r == 0 else f"alt{r}"}
                     for r in range(top)}
                    for k, w in enumerate(words)
                ]
                outputs.append(pb_utils.Tensor("logprobs", np.array([json.dumps(logprobs).encode()], dtype=np.object_)))
            outputs.append(pb_utils.Tensor("num_input_tokens", np.array([len(words)], np.uint32)))
            outputs.append(pb_utils.Tensor("num_output_tokens", np.array([len(words)], np.uint32)))
            request.get_response_sender().send(
                pb_utils.InferenceResponse(outputs), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
        return None
"""


def mock_llm(
    repo: Path, name: str = "mock_llm", step_seconds: float = 0.005, batching: bool = True, inflight: bool = False
) -> Path:
    """The example mock_llm as `name`, with its step time, without dynamic batching when not `batching`, and
    static batching (each execute generates its batch to the end) unless `inflight`."""
    target = repo / name
    shutil.copytree(EXAMPLE_REPO / "mock_llm", target)
    config = (target / "config.pbtxt").read_text()
    config = config.replace('name: "mock_llm"', f'name: "{name}"')
    config = config.replace('string_value: "0.01"', f'string_value: "{step_seconds}"')
    config = config.replace('string_value: "true"', f'string_value: "{str(inflight).lower()}"')
    if not batching:
        config = config.replace("dynamic_batching { max_queue_delay_microseconds: 1000 }", "")
        config = config.replace("max_batch_size: 64", "max_batch_size: 0").replace("dims: [ 1 ]", "dims: [ 1, 1 ]")
        config = config.replace("dims: [ -1 ]", "dims: [ 1, -1 ]")
    (target / "config.pbtxt").write_text(config)
    return target


ALL = ("mock_llm", "mock_llm_nobatch", "mock_llm_inflight", "mock_embedding", "mock_fail", "mock_vllm", "my_llm")


def build_repo(root: Path, models: tuple[str, ...] = ALL) -> Path:
    """`models` of: mock_llm (static batching; LoRA adapter 'doll'), mock_llm_nobatch, mock_llm_inflight (in-flight
    batching), mock_embedding, mock_fail (streams a word, then an error), mock_vllm (vLLM's tensor format,
    logprobs, its own chat template) and my_llm (the model of docs/openai.md), in `root/repo`."""
    repo = root / "repo"
    repo.mkdir()
    mock_llm(repo)
    # LoRA adapters of mock_llm, as Triton lists them (served with --lora-separator)
    (repo / "mock_llm" / "1" / "multi_lora.json").write_text(json.dumps({"doll": "adapters/doll"}))
    mock_llm(repo, "mock_llm_nobatch", batching=False)
    mock_llm(repo, "mock_llm_inflight", inflight=True)
    write_model(
        repo,
        "mock_embedding",
        """
        backend: "python"
        max_batch_size: 16
        dynamic_batching { }
        input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [
          { name: "embedding" data_type: TYPE_FP32 dims: [ 8 ] },
          { name: "num_input_tokens" data_type: TYPE_UINT32 dims: [ 1 ] }
        ]
        """,
        EMBEDDING_PY,
    )
    write_model(
        repo,
        "mock_fail",
        """
        backend: "python"
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
        """,
        FAIL_PY,
    )
    write_model(
        repo,
        "mock_vllm",
        """
        backend: "python"
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [
          { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
          { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] },
          { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] },
          { name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
          { name: "return_logprobs" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
          { name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
          { name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
        ]
        output [
          { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
          { name: "logprobs" data_type: TYPE_STRING dims: [ -1 ] },
          { name: "num_input_tokens" data_type: TYPE_UINT32 dims: [ 1 ] },
          { name: "num_output_tokens" data_type: TYPE_UINT32 dims: [ 1 ] }
        ]
        """,
        VLLM_PY,
    )
    # mock_vllm brings its own chat template (it wins over --tokenizer): the messages' contents, upper case
    (repo / "mock_vllm" / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.content | upper }}{% endfor %}"
    )
    docs_generator(repo)
    for extra in set(ALL) - set(models):
        shutil.rmtree(repo / extra)
    return repo


def docs_generator(repo: Path) -> None:
    """docs/openai.md's "Serve your own generator" model, as `my_llm` (so the guide cannot rot)."""
    text = (ROOT / "docs" / "openai.md").read_text()
    section = text[text.index("## Serve your own generator") :]
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", section, re.S | re.M)
    config = next(body for lang, body in blocks if 'backend: "python"' in body)
    code = next(body for lang, body in blocks if lang == "python")
    write_model(repo, "my_llm", config, code)


def last_message_tokenizer(root: Path) -> Path:
    """A tokenizer folder whose chat template renders only the last message's content."""
    folder = root / "tokenizer"
    folder.mkdir()
    config = {"chat_template": "{{ messages[-1]['content'] }}", "bos_token": "<s>", "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@contextmanager
def openai_server(
    root: Path, extra: list[str] | None = None, models: tuple[str, ...] = ALL
) -> Iterator[tuple[ServerProcess, str]]:
    """A server on build_repo's `models` with the OpenAI API on; yields (server, base URL of /v1)."""
    port = free_port()
    args = ["--openai-port", str(port), "--openai-address", "127.0.0.1", *(extra or [])]
    with running_server([build_repo(root, models)], root / "server.log", args) as server:
        yield server, f"http://127.0.0.1:{port}"
