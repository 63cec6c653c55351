"""Ensemble configs with graph errors are rejected at load, with messages naming the step and the tensor."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import write_model
from tests.integration.models import python_config
from tests.integration.test_ensemble import AFFINE_CONFIG, AFFINE_PY, _step, ensemble_config

INT_CONFIG = python_config("cfg_int", [("INPUT0", "TYPE_INT32", [-1])], [("OUTPUT0", "TYPE_INT32", [-1])])

BAD = {
    "bad_missing_model": (
        [_step("cfg_affine", "IN", "a"), _step("no_such_model", "a", "OUT")],
        "step 1 (model 'no_such_model') is not available",
    ),
    "bad_twice": (
        [_step("cfg_affine", "IN", "OUT"), _step("cfg_affine", "IN", "OUT")],
        "step 1 (model 'cfg_affine') output 'OUTPUT0' maps to ensemble tensor 'OUT', which step 0 (model "
        "'cfg_affine') already produces",
    ),
    "bad_unavailable_input": (
        [_step("cfg_affine", "nowhere", "OUT")],
        "step 0 (model 'cfg_affine') input 'INPUT0' reads ensemble tensor 'nowhere', which is neither an ensemble "
        "input nor produced by any step",
    ),
    "bad_cycle": (
        [
            _step("cfg_affine", "IN", "x"),
            _step("cfg_affine", "z", "y"),
            _step("cfg_affine", "y", "z"),
            _step("cfg_affine", "x", "OUT"),
        ],
        "the steps form a cycle",
    ),
    "bad_dtype": (
        [_step("cfg_int", "IN", "OUT")],
        "ensemble tensor 'IN' is TYPE_FP32 from ensemble input 'IN' but TYPE_INT32 for step 0 (model 'cfg_int') "
        "input 'INPUT0'",
    ),
    "bad_output_not_produced": (
        [_step("cfg_affine", "IN", "other")],
        "ensemble output 'OUT' is not produced by any step",
    ),
}


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    import tritonclient.grpc as grpcclient

    from tests.conftest import ServerProcess

    tmp = tmp_path_factory.mktemp("enscfg")
    repo: Path = tmp / "repo"
    write_model(repo, "cfg_affine", AFFINE_CONFIG.format(name="cfg_affine", params=""), AFFINE_PY)
    write_model(repo, "cfg_int", INT_CONFIG, AFFINE_PY)
    for name, (steps, _) in BAD.items():
        write_model(repo, name, ensemble_config(name, steps, ["OUT"]))
    write_model(repo, "good", ensemble_config("good", [_step("cfg_affine", "IN", "OUT")], ["OUT"]))
    server = ServerProcess([repo], ["--exit-on-error=false"], tmp / "server.log")
    try:
        server.wait_ready()
        client = grpcclient.InferenceServerClient(server.url)
        rows = client.get_model_repository_index().models
        client.close()
        return {r.name: f"{r.state}: {r.reason}" for r in rows}
    finally:
        server.stop()


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_ensemble_rejected_at_load(index: dict[str, str], name: str) -> None:
    state = index[name]
    assert state.startswith("UNAVAILABLE: "), state
    assert f"ensemble '{name}': " in state and BAD[name][1] in state, state


def test_good_ensemble_loads_next_to_bad_ones(index: dict[str, str]) -> None:
    assert index["good"].startswith("READY"), index["good"]
