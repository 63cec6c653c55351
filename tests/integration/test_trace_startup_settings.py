"""Trace settings and the server's start: clearing the global settings restores what --trace-config started it
with (Triton's L0_trace/trace_endpoint_test expectation, issue 32 item 10), and every --trace-config spelling
Triton's parser takes starts the server (a global log_frequency: issue 32 item 4)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.conftest import EXAMPLE_REPO, ServerProcess, running_server

STARTUP = {
    "trace_level": ["TIMESTAMPS"],
    "trace_rate": ["5"],
    "trace_count": ["50"],
    "log_frequency": ["3"],
    "trace_mode": ["triton"],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("trace_startup")
    args = [
        "--trace-config", f"triton,file={tmp / 'trace.json'}", "--trace-config", "triton,log-frequency=3",
        "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=5", "--trace-config", "count=50",
        "--trace-config=log_frequency=1",  # a global key Triton 2.51 accepts (and ignores): must not stop us
    ]  # fmt: skip
    with running_server([EXAMPLE_REPO], tmp / "server.log", args) as s:
        yield s


def _grpc_settings(client: grpcclient.InferenceServerClient) -> dict[str, list[str]]:
    settings = client.get_trace_settings(as_json=True)["settings"]
    return {k: settings[k]["value"] for k in STARTUP}


def test_a_global_log_frequency_starts_the_server_with_one_warning(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    assert _grpc_settings(client) == STARTUP  # ignored, as Triton 2.51 does (its settings then show 0)
    client.close()
    warnings = [line for line in server.log().splitlines() if "log_frequency=1" in line]
    assert len(warnings) == 1 and "ignoring --trace-config global setting" in warnings[0]
    assert "did you mean 'triton,log-frequency=1'?" in warnings[0]


def test_clearing_global_settings_restores_the_startup_values_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    try:
        changed = {"trace_level": ["TENSORS"], "trace_rate": "9", "trace_count": "7", "log_frequency": "2"}
        client.update_trace_settings(settings=changed)
        assert _grpc_settings(client)["trace_rate"] == ["9"]
        client.update_trace_settings(settings=dict.fromkeys(changed))  # None clears a key
        assert _grpc_settings(client) == STARTUP
    finally:
        client.update_trace_settings(settings=dict.fromkeys(STARTUP.keys() - {"trace_mode"}))
        client.close()


def test_clearing_global_settings_restores_the_startup_values_http(server: ServerProcess) -> None:
    url = f"http://{server.http_url}/v2/trace/setting"
    changed = {"trace_level": ["TENSORS"], "trace_rate": "9", "trace_count": "7", "log_frequency": "2"}
    assert requests.post(url, json=changed, timeout=30).json()["trace_rate"] == "9"
    cleared = requests.post(url, json=dict.fromkeys(changed), timeout=30)
    assert cleared.status_code == 200, cleared.text
    body = cleared.json()
    assert {k: body[k] if isinstance(body[k], list) else [body[k]] for k in STARTUP} == STARTUP
    assert requests.get(url, timeout=30).json() == body


def test_trace_file_keeps_its_place(server: ServerProcess, tmp_path: Path) -> None:
    before = requests.get(f"http://{server.http_url}/v2/trace/setting", timeout=30).json()["trace_file"]
    requests.post(f"http://{server.http_url}/v2/trace/setting", json={"trace_file": None}, timeout=30)
    assert requests.get(f"http://{server.http_url}/v2/trace/setting", timeout=30).json()["trace_file"] == before
