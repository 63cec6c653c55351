"""--log-file and --log-format through a real server: Triton's line layouts, json lines, SIGHUP reopening the file
after rotation, and the log-settings API switching the format while the server runs."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from tests.conftest import ServerProcess
from tests.integration.models import write_python_model

DEFAULT_LINE = re.compile(r'^I\d{4} \d\d:\d\d:\d\d\.\d{6} (\d+) repository\.py:\d+\] "successfully loaded \'one\'"$')
ISO_LINE = re.compile(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I (\d+) repository\.py:\d+\] "successfully loaded \'one\'"$')


def _wait_for_line(path: Path, predicate: Callable[[str], bool], timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                if predicate(line):
                    return line
        time.sleep(0.05)
    raise AssertionError(f"no matching line in {path}:\n{path.read_text() if path.exists() else '(missing)'}")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    write_python_model(repo, "one")
    return repo


@pytest.mark.parametrize(("fmt", "pattern"), [("default", DEFAULT_LINE), ("ISO8601", ISO_LINE)])
def test_triton_layouts(
    repo: Path, tmp_path: Path, start_server: Callable[..., ServerProcess], fmt: str, pattern: re.Pattern[str]
) -> None:
    log_file = tmp_path / "trireme.log"
    server = start_server([repo], [f"--log-file={log_file}", f"--log-format={fmt}"])
    line = _wait_for_line(log_file, lambda s: "successfully loaded 'one'" in s)
    m = pattern.match(line)
    assert m is not None, line
    assert int(m.group(1)) == server.proc.pid
    # the log went to the file, not to the server's output
    assert "successfully loaded 'one'" not in server.log()


def test_json_lines_and_rotation(repo: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    log_file = tmp_path / "trireme.log"
    server = start_server(
        [repo], [f"--log-file={log_file}", "--log-format=json", "--model-control-mode=explicit", "--load-model=one"]
    )
    line = _wait_for_line(log_file, lambda s: "successfully loaded 'one'" in s)
    record = json.loads(line)
    assert record["level"] == "INFO" and record["model"] == "one" and record["pid"] == server.proc.pid
    assert record["message"] == "successfully loaded 'one'" and record["file"] == "repository.py"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", record["timestamp"])
    for text in log_file.read_text().splitlines():
        json.loads(text)  # every line is one JSON object

    # rotation: move the file away, SIGHUP, and the next lines go to a new file at the same path
    rotated = tmp_path / "trireme.log.1"
    os.rename(log_file, rotated)
    os.kill(server.proc.pid, signal.SIGHUP)
    _wait_for_line(log_file, lambda s: "reopened the log file" in s)
    client = httpclient.InferenceServerClient(server.http_url)
    client.unload_model("one")
    client.load_model("one")
    _wait_for_line(log_file, lambda s: "successfully loaded 'one'" in s)
    assert "reopened" not in rotated.read_text()
    assert server.proc.poll() is None  # SIGHUP did not stop the server
    assert client.is_server_live()


def test_log_settings_switch_format(repo: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    log_file = tmp_path / "trireme.log"
    server = start_server([repo], [f"--log-file={log_file}", "--model-control-mode=explicit"])
    client = httpclient.InferenceServerClient(server.http_url)
    settings = client.get_log_settings()
    assert settings["log_file"] == str(log_file) and settings["log_format"] == "default"

    assert client.update_log_settings({"log_format": "json"})["log_format"] == "json"
    client.load_model("one")
    record = json.loads(_wait_for_line(log_file, lambda s: s.startswith("{") and "successfully loaded" in s))
    assert record["model"] == "one"

    assert client.update_log_settings({"log_format": "ISO8601"})["log_format"] == "ISO8601"
    client.unload_model("one")
    client.load_model("one")
    _wait_for_line(log_file, lambda s: ISO_LINE.match(s) is not None)

    with pytest.raises(Exception, match="log_format"):
        client.update_log_settings({"log_format": "xml"})
    with pytest.raises(Exception, match="log_file"):
        client.update_log_settings({"log_file": str(tmp_path / "other.log")})
    assert client.get_log_settings()["log_format"] == "ISO8601"


def test_bad_log_flags(tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    server = start_server(args=["--log-format=xml"], wait=False)
    server.proc.wait(60)
    assert server.proc.returncode != 0 and "--log-format" in server.log()
    server = start_server(args=[f"--log-file={tmp_path / 'missing' / 'x.log'}"], wait=False)
    server.proc.wait(60)
    assert server.proc.returncode != 0 and "cannot open" in server.log()
