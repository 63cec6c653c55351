"""How each server of the peer benchmark starts (pinned with taskset), which routes and bodies it answers, and how
to read its answers. Trireme runs from this checkout in Trireme's venv; every peer from its own virtualenv
(tools/install-peers.sh)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.servers import ROOT, free_port

HERE = Path(__file__).resolve().parent
VENVS = Path(os.environ.get("TRIREME_PEERS_DIR", Path.home() / ".cache" / "trireme" / "peers"))

# The three workloads: a 16-float identity, and the scikit-learn model one row per request with the server's
# batching off or on.
IDENTITY, SKLEARN, SKLEARN_BATCHED = "identity", "sklearn", "sklearn_batched"


@dataclass
class Route:
    path: str
    body: dict[str, Any]
    v2: bool = False  # an Open Inference Protocol answer: the values are outputs[0].data


@dataclass
class Launch:
    """One server process: its command and the workloads it serves."""

    name: str  # e.g. "mlserver", "litserve(batch)"
    venv: str  # the virtualenv under VENVS ("" for Trireme)
    command: list[str]  # without the taskset prefix
    routes: dict[str, Route]
    env: dict[str, str] = field(default_factory=dict)


def row_values() -> list[float]:
    """The one input row every request carries (the first sample of the training data, rounded)."""
    from sklearn.datasets import make_classification

    x, _ = make_classification(n_samples=2000, n_features=16, n_informative=8, random_state=0)
    return [round(float(v), 4) for v in x[0]]


def v2_body(name: str, row: list[float]) -> dict[str, Any]:
    return {"inputs": [{"name": name, "shape": [1, len(row)], "datatype": "FP32", "data": row}]}


def answer_values(route: Route, payload: bytes) -> list[float]:
    """The numbers a server answered (identity: the 16 values; model: the label)."""
    doc = json.loads(payload)
    if route.v2:
        return [float(v) for v in _flatten(doc["outputs"][0]["data"])]
    return [float(v) for v in _flatten(doc)]


def _flatten(doc: Any) -> list[Any]:
    if isinstance(doc, dict):
        return [v for item in doc.values() for v in _flatten(item)]
    if isinstance(doc, list):
        return [v for item in doc for v in _flatten(item)]
    return [doc]


_SKLEARN_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 32
input [ {{ name: "FEATURES" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{batching}"""

_SKLEARN_MODEL = """import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, {peers!r})
from common import build_model  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        self.model = build_model()

    def execute(self, requests):
        rows = [pb_utils.get_input_tensor_by_name(r, "FEATURES").as_numpy() for r in requests]
        labels = self.model.predict(np.concatenate(rows)).astype(np.int64).reshape(-1, 1)
        out, start = [], 0
        for r in rows:
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("LABEL", labels[start : start + len(r)])]))
            start += len(r)
        return out
"""


def trireme_launch(work: Path, port: int, row: list[float]) -> Launch:
    """Trireme on the example identity_fp32 and the scikit-learn model without and with dynamic batching."""
    repo = work / "trireme_repo"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(ROOT / "service" / "example_models" / "identity_fp32", repo / "identity_fp32")
    for name, batching in ((SKLEARN, ""), (SKLEARN_BATCHED, "dynamic_batching { }\n")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(_SKLEARN_CONFIG.format(name=name, batching=batching))
        (repo / name / "1" / "model.py").write_text(_SKLEARN_MODEL.format(peers=str(HERE)))
    cmd = [
        sys.executable, "-m", "service", "serve", "--model-repository", str(repo),
        "--http-address", "127.0.0.1", "--http-port", str(port), "--grpc-address", "127.0.0.1",
        "--grpc-port", str(free_port()), "--metrics-address", "127.0.0.1", "--metrics-port", str(free_port()),
    ]  # fmt: skip
    routes = {
        IDENTITY: Route("/v2/models/identity_fp32/infer", v2_body("INPUT0", row), v2=True),
        SKLEARN: Route(f"/v2/models/{SKLEARN}/infer", v2_body("FEATURES", row), v2=True),
        SKLEARN_BATCHED: Route(f"/v2/models/{SKLEARN_BATCHED}/infer", v2_body("FEATURES", row), v2=True),
    }
    return Launch("trireme", "", cmd, routes, env={"PYTHONPATH": str(ROOT)})


def mlserver_launch(work: Path, port: int, row: list[float]) -> Launch:
    """MLServer (its default parallel inference worker) with custom runtimes; adaptive batching on one model."""
    repo = work / "mlserver_repo"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    settings = {"host": "127.0.0.1", "http_port": port, "grpc_port": free_port(), "metrics_port": free_port()}
    (repo / "settings.json").write_text(json.dumps(settings))
    models = {
        IDENTITY: {"implementation": "mlserver_runtime.Identity"},
        SKLEARN: {"implementation": "mlserver_runtime.SkModel"},
        SKLEARN_BATCHED: {"implementation": "mlserver_runtime.SkModel", "max_batch_size": 32, "max_batch_time": 0.001},
    }
    for name, model in models.items():
        (repo / name).mkdir()
        (repo / name / "model-settings.json").write_text(json.dumps({"name": name, **model}))
    routes = {
        IDENTITY: Route(f"/v2/models/{IDENTITY}/infer", v2_body("INPUT0", row), v2=True),
        SKLEARN: Route(f"/v2/models/{SKLEARN}/infer", v2_body("FEATURES", row), v2=True),
        SKLEARN_BATCHED: Route(f"/v2/models/{SKLEARN_BATCHED}/infer", v2_body("FEATURES", row), v2=True),
    }
    return Launch("mlserver", "mlserver", [_bin("mlserver", "mlserver"), "start", str(repo)], routes)


def plain_routes(row: list[float], batched_path: str | None, batched_rows: bool = False) -> dict[str, Route]:
    routes = {IDENTITY: Route("/identity", {"data": row}), SKLEARN: Route("/predict", {"features": row})}
    if batched_path:
        routes[SKLEARN_BATCHED] = Route(batched_path, {"features": [row] if batched_rows else row})
    return routes


def peer_launches(work: Path, port: int, row: list[float], name: str) -> list[Launch]:
    """The server processes of one peer (LitServe needs one per batch setting; the others serve all three)."""
    py = _bin(name, "python")
    if name == "fastapi":
        return [Launch("fastapi", name, [py, str(HERE / "fastapi_server.py"), str(port)], plain_routes(row, None))]
    if name == "rayserve":
        cmd = [py, str(HERE / "rayserve_server.py"), str(port)]
        return [
            Launch("rayserve", name, cmd, plain_routes(row, "/predict_batched"), env={"RAY_USAGE_STATS_ENABLED": "0"})
        ]
    if name == "bentoml":
        cmd = [_bin(name, "bentoml"), "serve", "bentoml_server:Peer", "--host", "127.0.0.1", "--port", str(port)]
        routes = plain_routes(row, "/predict_batched", batched_rows=True)
        routes[IDENTITY] = Route("/identity", {"data": row})
        return [Launch("bentoml", name, cmd, routes, env={"BENTOML_DO_NOT_TRACK": "True"})]
    if name == "litserve":
        script = str(HERE / "litserve_server.py")
        off = plain_routes(row, None)
        off = {k: Route("/predict", r.body) for k, r in off.items()}
        on = {SKLEARN_BATCHED: Route("/predict", {"features": row})}
        return [
            Launch("litserve", name, [py, script, str(port)], off),
            Launch("litserve(batch)", name, [py, script, str(port), "--batch", "32"], on),
        ]
    if name == "mlserver":
        return [mlserver_launch(work, port, row)]
    if name == "trireme":
        return [trireme_launch(work, port, row)]
    raise ValueError(f"unknown server '{name}'")


def start(launch: Launch, log: Path, cpus: str) -> subprocess.Popen[bytes]:
    """Start one server pinned to `cpus`, in its own session (so that run.py can find and end its whole tree)."""
    env = {**os.environ, **launch.env}
    if launch.venv:
        env["PYTHONPATH"] = str(HERE)
        env.pop("VIRTUAL_ENV", None)
    return subprocess.Popen(
        ["taskset", "-c", cpus, *launch.command],
        cwd=HERE if launch.venv else ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def installed(name: str) -> bool:
    return name == "trireme" or (VENVS / name / ".installed").exists()


def _bin(venv: str, exe: str) -> str:
    return str(VENVS / venv / "bin" / exe)


def versions(names: Sequence[str]) -> dict[str, str]:
    """The framework version in each peer's venv, from its pip freeze."""
    wanted = {
        "fastapi": "fastapi",
        "mlserver": "mlserver",
        "litserve": "litserve",
        "rayserve": "ray",
        "bentoml": "bentoml",
    }
    out = {}
    for name in names:
        freeze = VENVS / name / ".installed"
        if name in wanted and freeze.exists():
            for line in freeze.read_text().splitlines():
                if line.lower().startswith(wanted[name] + "=="):
                    out[name] = line.split("==", 1)[1]
    return out
