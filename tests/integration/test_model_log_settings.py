"""Log settings reach models: pb_utils.Logger lines are logged by the server under its current settings, so a
change through the log-settings API applies to every worker's (and in-process instance's) next line at once."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ServerProcess, running_server, write_model

MODEL_PY = """
    import triton_python_backend_utils as pb_utils

    Logger = pb_utils.Logger


    class TritonPythonModel:
        def initialize(self, args):
            self.name = args["model_name"]

        def execute(self, requests):
            responses = []
            for request in requests:
                n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
                tag = f"{self.name}-{n}"
                Logger.log_info(f"info-line {tag}")
                Logger.log_warn(f"warn-line {tag}")
                Logger.log_error(f"error-line {tag}")
                Logger.log_verbose(f"verbose-line {tag}")
                Logger.log(f"enum-warning-line {tag}", Logger.WARNING)
                out = pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(request, "N").as_numpy())
                responses.append(pb_utils.InferenceResponse([out]))
            return responses
"""

MODES = ["process", "in_process"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("modellog")
    for mode in MODES:
        write_model(
            tmp / "repo",
            f"logger_{mode}",
            f"""
            name: "logger_{mode}"
            backend: "python"
            input [ {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }} ]
            output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
            parameters {{ key: "TRIREME_INSTANCE_MODE" value: {{ string_value: "{mode}" }} }}
            """,
            MODEL_PY,
        )
    with running_server([tmp / "repo"], tmp / "server.log") as srv:
        yield srv


def _lines_of(server: ServerProcess, model: str, n: int) -> set[str]:
    """Which of the model's five lines for request n the server logged (waits for the last enabled one)."""
    with grpcclient.InferenceServerClient(server.url) as client:
        x = grpcclient.InferInput("N", [1], "INT32")
        x.set_data_from_numpy(np.array([n], np.int32))
        client.infer(model, [x])
    kinds = ("info-line", "warn-line", "error-line", "verbose-line", "enum-warning-line")
    time.sleep(0.2)  # a worker's lines reach the server before its response (one socket); a margin for the file
    log = server.log()
    return {k for k in kinds if re.search(rf"(?<![\w-]){k} {model}-{n}\b", log)}


@pytest.mark.parametrize("mode", MODES)
def test_settings_changes_reach_model_lines_at_once(server: ServerProcess, mode: str) -> None:
    model = f"logger_{mode}"
    with httpclient.InferenceServerClient(server.http_url) as http:
        http.update_log_settings({"log_verbose_level": 0, "log_info": True, "log_warning": True, "log_error": True})
        assert _lines_of(server, model, 1) == {"info-line", "warn-line", "error-line", "enum-warning-line"}
        http.update_log_settings({"log_verbose_level": 1})
        assert _lines_of(server, model, 2) == {
            "info-line",
            "warn-line",
            "error-line",
            "verbose-line",
            "enum-warning-line",
        }
        http.update_log_settings({"log_info": False, "log_warning": False})
        assert _lines_of(server, model, 3) == {"error-line", "verbose-line"}
        http.update_log_settings({"log_verbose_level": 0, "log_error": False, "log_warning": True})
        assert _lines_of(server, model, 4) == {"warn-line", "enum-warning-line"}
        http.update_log_settings({"log_verbose_level": 0, "log_info": True, "log_warning": True, "log_error": True})


def test_severity_flags_set_the_start_up_settings(tmp_path: Path, start_server: Any) -> None:
    """--log-info=false (Triton's flag): no INFO line from the server or its models, warnings still logged."""
    write_model(
        tmp_path / "repo",
        "logger_process",
        """
        name: "logger_process"
        backend: "python"
        input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """,
        MODEL_PY,
    )
    server = start_server([tmp_path / "repo"], ["--log-info=false", "--log-error=false"])
    with httpclient.InferenceServerClient(server.http_url) as http:
        settings = http.get_log_settings()
        assert (settings["log_info"], settings["log_warning"], settings["log_error"]) == (False, True, False)
    assert _lines_of(server, "logger_process", 1) == {"warn-line", "enum-warning-line"}
    assert "successfully loaded" not in server.log()
