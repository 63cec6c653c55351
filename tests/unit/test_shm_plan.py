"""The arena size decision at start: keep, shrink to what /dev/shm holds, or refuse with a --shm-size message."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core.repository.shm_plan import MIB, fit_arena_bytes, model_workers, plan_arenas
from service.errors import ServiceError
from tests.conftest import write_model

IDENTITY = """
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
    {extra}
"""


def test_fits_keeps_the_configured_size() -> None:
    plan = fit_arena_bytes(256 * MIB, workers=3, free=4 * 3 * 256 * MIB)
    assert plan.arena_bytes == 256 * MIB and not plan.shrunk and not plan.reserve


def test_shrinks_to_whole_mib_in_three_quarters_and_reserves() -> None:
    plan = fit_arena_bytes(256 * MIB, workers=3, free=64 * MIB)
    assert plan.shrunk and plan.reserve
    assert plan.arena_bytes == 8 * MIB  # 48 MiB / 6 arenas
    assert 2 * 3 * plan.arena_bytes <= 48 * MIB


def test_reserves_when_the_arenas_take_over_half() -> None:
    assert fit_arena_bytes(8 * MIB, workers=1, free=24 * MIB).reserve
    assert not fit_arena_bytes(8 * MIB, workers=1, free=40 * MIB).reserve


def test_too_small_names_shm_size() -> None:
    with pytest.raises(ServiceError) as e:
        fit_arena_bytes(256 * MIB, workers=4, free=5 * MIB)
    assert "--shm-size=" in e.value.message and "/dev/shm has 5 MiB free" in e.value.message


def test_model_workers_counts_instances_devices_and_versions(tmp_path: Path) -> None:
    one = write_model(tmp_path, "one", IDENTITY.format(name="one", extra=""), "")
    three = write_model(
        tmp_path, "three", IDENTITY.format(name="three", extra="instance_group [ { count: 3 kind: KIND_CPU } ]"), ""
    )
    two_versions = write_model(
        tmp_path,
        "two_versions",
        IDENTITY.format(name="two_versions", extra="version_policy: { all { } }"),
        "",
        version=1,
    )
    (two_versions / "2").mkdir()
    ensemble = write_model(tmp_path, "ens", 'name: "ens"\nplatform: "ensemble"\n')
    assert model_workers(str(one)) == 1
    assert model_workers(str(three)) == 3
    assert model_workers(str(two_versions)) == 2
    assert model_workers(str(ensemble)) == 0
    broken = write_model(tmp_path, "broken", "this is not a config {")
    assert model_workers(str(broken)) == 1


def test_plan_reads_the_free_space_of_the_directory(tmp_path: Path) -> None:
    model = write_model(tmp_path, "m", IDENTITY.format(name="m", extra=""), "")
    # a 1 MiB arena always fits in the free space of a real filesystem; 2**50 bytes never does
    assert plan_arenas([str(model)], MIB, shm_dir=str(tmp_path)).arena_bytes == MIB
    assert plan_arenas([str(model)], 1 << 50, shm_dir=str(tmp_path)).shrunk
