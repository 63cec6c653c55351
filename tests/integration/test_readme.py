"""The README carries a newcomer through (issue 33): every shape its table states is the one served, and its own
install command, run in a fresh venv, gives what its next examples use (they then run as written)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from protos import model_config_pb2 as mc
from service.core.repository.model_config import parse_config_text
from tests.conftest import EXAMPLE_REPO, free_port

pytestmark = pytest.mark.single_pass

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
ROW = re.compile(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \|", re.M)
GROUP = re.compile(r"([A-Z0-9]+) ((?:`\w+`(?:, )?)+) \[([-\d,]+)\]")  # FP32 `INPUT0`, `INPUT1` [4]
TYPE_NAMES = {"STRING": "BYTES"}  # config TYPE_STRING is BYTES on the wire


def section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def served(model: str) -> tuple[dict[str, tuple[str, list[int]]], set[str]]:
    """tensor name -> (datatype, shape as model metadata reports it) from the example's config.pbtxt, and the
    names a reader must be told about (every output, every input that is not optional)."""
    path = EXAMPLE_REPO / model / "config.pbtxt"
    config = parse_config_text(path.read_text(), str(path))
    batch = [-1] if config.max_batch_size > 0 else []
    out = {}
    for tensor in [*config.input, *config.output]:
        kind = mc.DataType.Name(tensor.data_type).removeprefix("TYPE_")
        out[tensor.name] = (TYPE_NAMES.get(kind, kind), [*batch, *tensor.dims])
    required = {t.name for t in config.input if not t.optional} | {t.name for t in config.output}
    return out, required


def test_readme_table_states_the_served_shapes() -> None:
    rows = ROW.findall(section("The example models"))
    assert rows, "no model rows found in the README's table"
    models = {p.name for p in EXAMPLE_REPO.iterdir() if (p / "config.pbtxt").exists()}
    assert {r[0] for r in rows} == models  # every example model has its row, and no row names another
    for model, inputs, outputs in rows:
        tensors, required = served(model)
        stated = set()
        for kind, names, shape in GROUP.findall(inputs) + GROUP.findall(outputs):
            for name in re.findall(r"`(\w+)`", names):
                assert tensors[name] == (kind, [int(d) for d in shape.split(",")]), (model, name)
                stated.add(name)
        assert required <= stated, f"{model}: the README leaves out {sorted(required - stated)}"


def test_readme_install_gives_what_its_examples_use() -> None:
    (install,) = blocks(section("Install and serve"), "bash")
    assert "Python 3.11 or newer" in section("Install and serve")
    assert '".[client]"' in install
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^client = \["tritonclient\[grpc,http\]', pyproject, re.M)
    (snippet,) = blocks(section("Call it"), "python")
    assert "import numpy as np, tritonclient.grpc as grpcclient" in snippet


def test_readme_says_what_the_test_command_installs() -> None:
    text = " ".join(section("Run the tests").split())
    for needed in ("one line per step", "libb64-0d", "apache2-utils", "root", "skip", "~/.cache/trireme/tools"):
        assert needed in text, needed


def _tracked_copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_commands_run_in_a_fresh_venv(tmp_path: Path) -> None:
    """The README's install command verbatim in a copy of the checkout, then its server, Python and curl
    examples against that venv (ports moved to free ones: other servers may hold 8000-8002 here)."""
    (command,) = [line for line in blocks(section("Install and serve"), "bash")[0].splitlines() if line]
    install, serve = command.split(" && .venv/bin/trireme serve")
    assert serve == ""
    work = tmp_path / "trireme"
    _tracked_copy(work)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    out = subprocess.run(["bash", "-c", install], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]

    grpc, http, metrics = free_port(), free_port(), free_port()
    ports = ["--grpc-port", str(grpc), "--http-port", str(http), "--metrics-port", str(metrics)]
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(
        [".venv/bin/trireme", "serve", *ports], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        (snippet,) = blocks(section("Call it"), "python")
        snippet = snippet.replace("127.0.0.1:8001", f"127.0.0.1:{grpc}")
        (curl,) = blocks(section("Call it"), "bash")
        curl = curl.replace("localhost:8000", f"localhost:{http}")
        deadline = time.monotonic() + 120
        while b"Started GRPCInferenceService" not in (tmp_path / "server.log").read_bytes():
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.2)
        py = subprocess.run([".venv/bin/python", "-c", snippet], cwd=work, env=env, capture_output=True, text=True)
        assert py.returncode == 0, py.stderr
        assert py.stdout.strip() == "[2. 2. 2. 2.]"
        sh = subprocess.run(["bash", "-c", curl], cwd=work, env=env, capture_output=True, text=True, timeout=60)
        assert sh.returncode == 0, sh.stderr
        assert sh.stdout.startswith("ready\n")
        assert '"name":"OUTPUT0","datatype":"FP32","shape":[4],"data":[2.0,2.0,2.0,2.0]' in sh.stdout
        version = subprocess.run([".venv/bin/trireme", "--version"], cwd=work, capture_output=True, text=True)
        assert version.returncode == 0 and version.stdout.startswith("trireme ")
    finally:
        server.terminate()
        server.wait(60)
        log.close()
