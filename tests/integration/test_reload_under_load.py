"""Model changes under a steady load of unary and streaming clients: no request fails or is lost, and requests
sent after a reload returns see the new model. Explicit reload with a changed config, poll-mode change of
model.py, a new version folder under `latest { num_versions: 1 }`, instance count 1 -> 3 -> 1, broken reloads.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.steady_load import Outcome, SteadyLoad, tagged_config, tagged_model

MODEL = "tagged"


def _write(repo: Path, tag: float = 1, count: int = 1, param_tag: float = 0, version: int = 1, extra: str = "") -> None:
    (repo / MODEL / str(version)).mkdir(parents=True, exist_ok=True)
    (repo / MODEL / "config.pbtxt").write_text(tagged_config(MODEL, count, param_tag, extra))
    (repo / MODEL / str(version) / "model.py").write_text(tagged_model(tag))


def _check_clean(load: SteadyLoad, outcomes: list[Outcome]) -> None:
    assert not load.failures(), load.failures()[:3]
    assert load.lost() == 0
    assert any(o.stream for o in outcomes) and any(not o.stream for o in outcomes)


def _tags_after(outcomes: list[Outcome], t: float) -> set[float]:
    return {o.value[0] for o in outcomes if o.value is not None and o.sent > t}


def _wait_for_tag(load: SteadyLoad, tag: float, timeout_s: float = 60) -> float:
    """Poll mode: wait until a response carries `tag`; returns when that first response arrived."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        load.wait_answers(1)
        done = [o.done for o in list(load.outcomes) if o.value is not None and o.value[0] == tag]
        if done:
            return min(done)
    raise TimeoutError(f"no response with tag {tag} after {timeout_s} s")


@pytest.fixture
def explicit(tmp_path: Path, start_server: Any) -> Any:
    repo = tmp_path / "repo"
    _write(repo)
    return repo, start_server([repo], ["--model-control-mode=explicit", f"--load-model={MODEL}"])


def test_explicit_reload_with_changed_config(explicit: Any) -> None:
    repo, server = explicit
    client = grpcclient.InferenceServerClient(server.url)
    load = SteadyLoad(server.url, MODEL).start()
    load.wait_answers(20)
    (repo / MODEL / "config.pbtxt").write_text(tagged_config(MODEL, param_tag=10))
    client.load_model(MODEL)
    returned = time.monotonic()
    load.wait_answers(20)
    outcomes = load.stop()
    _check_clean(load, outcomes)
    assert _tags_after(outcomes, returned) == {11.0}
    assert {o.value[0] for o in outcomes if o.value is not None} == {1.0, 11.0}
    assert client.get_model_config(MODEL).config.parameters["tag"].string_value == "10"
    client.close()


def test_instance_count_1_3_1_keeps_the_first_instance(explicit: Any) -> None:
    repo, server = explicit
    client = grpcclient.InferenceServerClient(server.url)
    load = SteadyLoad(server.url, MODEL, unary=4, delay_s=0.01).start()
    load.wait_answers(10)
    first_pid = {o.value[2] for o in load.outcomes if o.value is not None}
    assert len(first_pid) == 1
    client.load_model(MODEL)  # nothing changed: a no-op, the instance keeps running
    (repo / MODEL / "config.pbtxt").write_text(tagged_config(MODEL, count=3))
    client.load_model(MODEL)
    grown = time.monotonic()
    load.wait_answers(60)
    (repo / MODEL / "config.pbtxt").write_text(tagged_config(MODEL, count=1))
    client.load_model(MODEL)
    shrunk = time.monotonic()
    load.wait_answers(20)
    outcomes = load.stop()
    _check_clean(load, outcomes)
    during = [o.value for o in outcomes if o.value is not None and grown < o.sent and o.done < shrunk]
    assert {v[1] for v in during} == {0.0, 1.0, 2.0}  # three instances served
    after = [o.value for o in outcomes if o.value is not None and o.sent > shrunk]
    assert {(v[1], v[2]) for v in after} == {(0.0, *first_pid)}  # only the original instance, never restarted
    assert len(client.get_model_config(MODEL).config.instance_group) == 1
    assert client.get_model_config(MODEL).config.instance_group[0].count == 1
    assert len(server.worker_pids()) == 1
    client.close()


def test_broken_reload_keeps_the_old_version_serving(explicit: Any) -> None:
    repo, server = explicit
    client = grpcclient.InferenceServerClient(server.url)
    load = SteadyLoad(server.url, MODEL).start()
    load.wait_answers(10)
    (repo / MODEL / "1" / "model.py").write_text("raise RuntimeError('broken on purpose')\n")
    with pytest.raises(InferenceServerException) as info:
        client.load_model(MODEL)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "load failed for model 'tagged': version 1 is at UNAVAILABLE state" in info.value.message()
    assert "broken on purpose" in info.value.message()
    (repo / MODEL / "config.pbtxt").write_text("this is { not a config")
    with pytest.raises(InferenceServerException) as info:
        client.load_model(MODEL)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    load.wait_answers(10)
    assert client.is_model_ready(MODEL)
    (row,) = client.get_model_repository_index().models
    assert row.state == "READY" and "reload failed" in row.reason
    outcomes = load.stop()
    _check_clean(load, outcomes)
    assert {o.value[0] for o in outcomes if o.value is not None} == {1.0}
    assert "failed to load 'tagged' version 1" in server.log()
    client.close()


@pytest.fixture
def polled(tmp_path: Path, start_server: Any) -> Any:
    repo = tmp_path / "repo"
    _write(repo)
    return repo, start_server([repo], ["--model-control-mode=poll", "--repository-poll-secs=0.3"])


def test_poll_mode_picks_up_a_changed_model_py(polled: Any) -> None:
    repo, server = polled
    client = grpcclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as info:
        client.load_model(MODEL)
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert info.value.message() == "explicit model load / unload is not allowed if polling is enabled"
    load = SteadyLoad(server.url, MODEL).start()
    load.wait_answers(10)
    (repo / MODEL / "1" / "model.py").write_text(tagged_model(2))
    switched = _wait_for_tag(load, 2.0)
    load.wait_answers(20)
    (repo / MODEL / "1" / "model.py").write_text("raise RuntimeError('broken on purpose')\n")
    deadline = time.monotonic() + 30
    while "failed to load 'tagged' version 1" not in server.log() and time.monotonic() < deadline:
        load.wait_answers(1)
    load.wait_answers(10)
    outcomes = load.stop()
    _check_clean(load, outcomes)
    assert _tags_after(outcomes, switched) == {2.0}  # and the broken model.py never took over
    (row,) = client.get_model_repository_index().models
    assert row.state == "READY" and "broken on purpose" in row.reason
    client.close()


def test_poll_mode_new_version_folder_with_latest_1(polled: Any) -> None:
    repo, server = polled
    client = grpcclient.InferenceServerClient(server.url)
    load = SteadyLoad(server.url, MODEL).start()
    load.wait_answers(10)
    _write(repo, tag=5, version=2)  # rewrites config.pbtxt unchanged: the policy is latest { num_versions: 1 }
    switched = _wait_for_tag(load, 5.0)
    load.wait_answers(20)
    outcomes = load.stop()
    _check_clean(load, outcomes)
    assert _tags_after(outcomes, switched) == {5.0}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = {(m.version, m.state, m.reason) for m in client.get_model_repository_index().models}
        if rows == {("1", "UNAVAILABLE", "unloaded"), ("2", "READY", "")}:
            break
        time.sleep(0.1)
    assert rows == {("1", "UNAVAILABLE", "unloaded"), ("2", "READY", "")}
    assert len(server.worker_pids()) == 1
    client.close()


def _wait_index(client: grpcclient.InferenceServerClient, want: set[tuple[str, str, str]]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = {(m.name, m.version, m.state) for m in client.get_model_repository_index().models}
        if rows == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"index {rows} != {want}")


def test_poll_mode_adds_updates_and_removes_models(polled: Any) -> None:
    repo, server = polled
    client = grpcclient.InferenceServerClient(server.url)
    load = SteadyLoad(server.url, MODEL, unary=2, streams=0).start()
    load.wait_answers(5)
    pid = {o.value[2] for o in load.outcomes if o.value is not None}
    # a comment in config.pbtxt changes the file, not the config: nothing restarts
    (repo / MODEL / "config.pbtxt").write_text(tagged_config(MODEL) + "# a comment\n")
    # a new model folder is loaded
    (repo / "second" / "1").mkdir(parents=True)
    (repo / "second" / "1" / "model.py").write_text(tagged_model(7))
    (repo / "second" / "config.pbtxt").write_text(tagged_config("second"))
    _wait_index(client, {(MODEL, "1", "READY"), ("second", "1", "READY")})
    # instance count 1 -> 2 through the file: an update, the first instance stays
    (repo / MODEL / "config.pbtxt").write_text(tagged_config(MODEL, count=2))
    deadline = time.monotonic() + 30
    while client.get_model_config(MODEL).config.instance_group[0].count != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.get_model_config(MODEL).config.instance_group[0].count == 2
    load.wait_answers(40)
    # the folder goes: the model is unloaded and leaves the index
    shutil.rmtree(repo / "second")
    _wait_index(client, {(MODEL, "1", "READY")})
    with pytest.raises(InferenceServerException) as info:
        client.infer("second", [])
    assert info.value.status() == "StatusCode.NOT_FOUND"
    outcomes = load.stop()
    assert not load.failures() and load.lost() == 0
    pids = {o.value[2] for o in outcomes if o.value is not None}
    assert pid <= pids and len(pids) == 2  # the original instance served throughout; one more joined
    assert len(server.worker_pids()) == 2
    client.close()


def test_sequence_model_instance_removal_waits_for_its_live_sequences(tmp_path: Path, start_server: Any) -> None:
    from tests.conftest import write_model
    from tests.integration.test_sequence import value_input
    from tests.integration.test_stream_models import ACCUMULATE_PY, accumulate_config

    repo = tmp_path / "repo"
    write_model(repo, "acc", accumulate_config("acc", 4, instances=2), ACCUMULATE_PY)
    server = start_server([repo], ["--model-control-mode=explicit", "--load-model=acc"])
    client = grpcclient.InferenceServerClient(server.url)

    def add(x: int, sid: int, start: bool = False, end: bool = False) -> int:
        r = client.infer("acc", value_input(x, True), sequence_id=sid, sequence_start=start, sequence_end=end)
        return int(r.as_numpy("OUTPUT").reshape(-1)[0])

    assert add(1, 101, start=True) == 1  # instance 0
    assert add(10, 202, start=True) == 10  # instance 1 (sequences spread over instances)
    (repo / "acc" / "config.pbtxt").write_text(accumulate_config("acc", 4, instances=1))
    returned: list[float] = []
    reload = threading.Thread(target=lambda: (client.load_model("acc"), returned.append(time.monotonic())))
    reload.start()
    time.sleep(1.0)
    assert not returned  # waiting for the live sequences of the instance that goes
    # both sequences keep their instance (their running sums survive); a new one starts on the one that stays
    assert add(2, 101) == 3 and add(20, 202) == 30
    assert add(5, 303, start=True) == 5
    ended = time.monotonic()
    assert add(30, 202, end=True) == 60
    reload.join(30)
    assert returned and returned[0] >= ended
    assert add(3, 101) == 6 and add(5, 303, end=True) == 10 and add(4, 101, end=True) == 10
    assert client.get_model_config("acc").config.instance_group[0].count == 1
    assert len(server.worker_pids()) == 1
    client.close()


def test_version_policy_change_keeps_the_versions_that_stay(tmp_path: Path, start_server: Any) -> None:
    repo = tmp_path / "repo"
    _write(repo, tag=1, version=1)
    _write(repo, tag=2, version=2)  # latest { num_versions: 1 } (the default): version 2 serves
    server = start_server([repo], ["--model-control-mode=explicit", f"--load-model={MODEL}"])
    client = grpcclient.InferenceServerClient(server.url)
    load = SteadyLoad(server.url, MODEL, unary=2, streams=1).start()
    load.wait_answers(10)
    (repo / MODEL / "config.pbtxt").write_text(
        tagged_config(MODEL, extra="version_policy { latest { num_versions: 2 } }")
    )
    client.load_model(MODEL)
    rows = {(m.version, m.state) for m in client.get_model_repository_index().models}
    assert rows == {("1", "READY"), ("2", "READY")}
    x = grpcclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    assert client.infer(MODEL, [x], model_version="1").as_numpy("OUTPUT0")[0] == 1.0
    (repo / MODEL / "config.pbtxt").write_text(
        tagged_config(MODEL, extra="version_policy { specific { versions: [2] } }")
    )
    client.load_model(MODEL)
    load.wait_answers(10)
    outcomes = load.stop()
    _check_clean(load, outcomes)
    assert {o.value[0] for o in outcomes if o.value is not None} == {2.0}  # unversioned calls: always version 2
    assert len({o.value[2] for o in outcomes if o.value is not None}) == 1  # and never restarted
    rows = {(m.version, m.state, m.reason) for m in client.get_model_repository_index().models}
    assert rows == {("1", "UNAVAILABLE", "unloaded"), ("2", "READY", "")}
    client.close()
