"""Host policies through a real server: each instance's worker process (every thread of it) runs on its policy's
cores, read back from /proc; numa-node binds its memory (the kernel's numa_maps says `bind:<node>`); a policy
name no flag defines fails that model's load while the rest serve; bad values stop the server at start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from service.config.host_policy import format_cores, numa_nodes, parse_core_list
from tests.conftest import ROOT, write_model

USABLE = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(USABLE) < 2, reason="needs at least two usable CPU cores")

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(1, np.float32))]) for _ in requests]
"""


def config(name: str, group: str) -> str:
    return f"""
    name: "{name}"
    backend: "python"
    input [{{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }}]
    output [{{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }}]
    instance_group [{{ {group} }}]
    """


def workers(server: Any) -> dict[str, int]:
    """instance name -> worker pid, from the workers' command lines (instance=<name>)."""
    found = {}
    for pid in server.worker_pids():
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        for word in words:
            if word.startswith("instance="):
                found[word[len("instance=") :]] = pid
    return found


def thread_cores(pid: int) -> set[tuple[int, ...]]:
    """The distinct Cpus_allowed_list of every thread of a process."""
    seen = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
        seen.add(parse_core_list(line.split(":", 1)[1].strip()))
    return seen


def test_instances_run_on_their_policy_cores(tmp_path: Path, start_server: Any) -> None:
    first, last = USABLE[0], USABLE[-1]
    repo = tmp_path / "repo"
    write_model(repo, "default_cpu", config("default_cpu", "kind: KIND_CPU count: 2"), MODEL)
    write_model(repo, "named", config("named", 'kind: KIND_CPU host_policy: "edge"'), MODEL)
    write_model(repo, "model_kind", config("model_kind", "kind: KIND_MODEL"), MODEL)
    write_model(repo, "ghost", config("ghost", 'kind: KIND_CPU host_policy: "ghost"'), MODEL)
    node = min(numa_nodes() or {0: ()})
    args = [
        f"--host-policy=cpu,cpu-cores={last}",  # Triton's default name of KIND_CPU instances
        f"--host-policy=edge,cpu-cores={first}",
        f"--host-policy=edge,numa-node={node}",
        "--exit-on-error=false",
    ]
    server = start_server([repo], args)
    pids = workers(server)
    assert thread_cores(pids["default_cpu_0_0"]) == {(last,)}
    assert thread_cores(pids["default_cpu_0_1"]) == {(last,)}
    assert thread_cores(pids["named_0_0"]) == {(first,)}
    assert thread_cores(pids["model_kind_0_0"]) == {tuple(USABLE)}  # no policy named 'model': anywhere
    if numa_nodes() is not None:
        maps = Path(f"/proc/{pids['named_0_0']}/numa_maps").read_text()
        assert f"bind:{node}" in maps
        assert f"bind:{node}" not in Path(f"/proc/{pids['default_cpu_0_0']}/numa_maps").read_text()
    index = requests.post(f"http://{server.http_url}/v2/repository/index", timeout=10).json()
    states = {m["name"]: (m["state"], m.get("reason", "")) for m in index}
    assert states["named"][0] == "READY"
    assert states["ghost"][0] == "UNAVAILABLE"
    assert "names host policy 'ghost', which no --host-policy defines (defined: cpu, edge)" in states["ghost"][1]
    assert "host policy 'edge': cores " + str(first) in server.log()


def test_bad_values_stop_the_server_at_start(tmp_path: Path) -> None:
    too_far = USABLE[-1] + 64
    cases = {
        f"--host-policy=cpu,cpu-cores=0-{too_far}": f"names core(s) {format_cores(range(USABLE[-1] + 1, too_far + 1))}",
        "--host-policy=cpu,cores=1": "Unsupported host policy setting 'cores' is specified",
        "--host-policy=cpu,numa-node=zero": "Parsing 'numa-node' value: Can't parse 'zero' to integer",
    }
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for flag, message in cases.items():
        run = subprocess.run(
            [sys.executable, "-m", "service", "--model-repository", str(tmp_path), flag],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            env=env,
        )
        assert run.returncode == 2, (flag, run.stderr)
        assert message in run.stderr, (flag, run.stderr)
