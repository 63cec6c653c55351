"""Poll-mode change detection (file snapshots) and the --load-model / control-mode rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.config.flags import parse_args
from service.core.repository.snapshots import snapshot


def _model(root: Path) -> Path:
    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "config.pbtxt").write_text('name: "m"\n')
    (root / "m" / "labels.txt").write_text("a\nb\n")
    (root / "m" / "1" / "model.py").write_text("x = 1\n")
    return root / "m"


def _touch(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a distinct mtime even on coarse clocks


def test_snapshot_splits_config_model_files_and_versions(tmp_path: Path) -> None:
    model = _model(tmp_path)
    s = snapshot(str(model))
    assert [f[0] for f in s.config] == ["config.pbtxt"]
    assert [f[0] for f in s.model_level] == ["labels.txt"]
    assert list(s.versions) == [1] and [f[0] for f in s.versions[1]] == ["model.py"]


def test_byte_code_caches_hidden_files_and_non_versions_are_ignored(tmp_path: Path) -> None:
    model = _model(tmp_path)
    before = snapshot(str(model))
    (model / "1" / "__pycache__").mkdir()
    (model / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (model / ".config.pbtxt.swp").write_text("swap")
    (model / "010").mkdir()  # not a version: starts with 0
    (model / "010" / "model.py").write_text("")
    assert snapshot(str(model)) == before


def test_each_kind_of_change_shows_where_it_happened(tmp_path: Path) -> None:
    model = _model(tmp_path)
    base = snapshot(str(model))
    _touch(model / "1" / "model.py", "x = 2\n")
    changed = snapshot(str(model))
    assert changed.versions[1] != base.versions[1]
    assert (changed.config, changed.model_level) == (base.config, base.model_level)
    (model / "2").mkdir()
    (model / "2" / "model.py").write_text("")
    assert set(snapshot(str(model)).versions) == {1, 2}
    _touch(model / "config.pbtxt", 'name: "m"\nmax_batch_size: 4\n')
    assert snapshot(str(model)).config != changed.config
    _touch(model / "labels.txt", "c\n")
    assert snapshot(str(model)).model_level != base.model_level


def test_a_removed_model_directory_snapshots_empty(tmp_path: Path) -> None:
    assert snapshot(str(tmp_path / "gone")) == snapshot(str(tmp_path / "also_gone"))


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_load_model_requires_explicit_mode(mode: str) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--model-repository", "/m", f"--model-control-mode={mode}", "--load-model=a"])
    assert str(info.value) == "Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
    config = parse_args(["--model-control-mode=poll", "--repository-poll-secs=2.5", "--model-unload-timeout-secs=4"])
    assert (config.repository_poll_secs, config.model_unload_timeout_secs) == (2.5, 4.0)
