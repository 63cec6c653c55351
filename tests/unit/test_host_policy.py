"""--host-policy parsing and checking (service/config/host_policy.py) and the placement a worker is handed."""

from __future__ import annotations

import os

import pytest

from service.config.flags import parse_args
from service.config.host_policy import (
    build_host_policies,
    default_policy_name,
    format_cores,
    parse_core_list,
)
from service.ipc.launch import PLACEMENT_ENV, placement_env, take_placement

TWO_NODES = {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
EIGHT = set(range(8))


def test_core_lists_take_ranges_and_lists() -> None:
    assert parse_core_list("0-3,8") == (0, 1, 2, 3, 8)
    assert parse_core_list("5") == (5,)
    assert parse_core_list("3,1-2,1") == (1, 2, 3)
    for bad in ("", "a", "1-", "-1", "3-1", "1,,2", "0x1"):
        with pytest.raises(ValueError):
            parse_core_list(bad)
    assert format_cores((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"


def test_settings_merge_by_name_and_numa_node_gives_the_node_cores() -> None:
    policies = build_host_policies(
        ["gpu_0,numa-node=1", "gpu_0,cpu-cores=4-5", "cpu,numa-node=0", "odd,cpu-cores=1,3"], EIGHT, TWO_NODES
    )
    assert policies["gpu_0"].cores() == (4, 5) and policies["gpu_0"].numa_node == 1
    assert policies["gpu_0"].bind_memory
    assert policies["cpu"].cores() == (0, 1, 2, 3)  # numa-node alone: the node's cores as well
    assert policies["odd"].cores() == (1, 3) and policies["odd"].numa_node is None


def test_bad_entries_name_the_problem() -> None:
    cases = {
        "x,foo=1": "Unsupported host policy setting 'foo' is specified, supported settings are 'numa-node', "
        "'cpu-cores'",
        "x,numa-node=abc": "Parsing 'numa-node' value: Can't parse 'abc' to integer",
        "x,numa-node=2": "numa-node 2 does not exist on this machine (its NUMA nodes: 0, 1)",
        "x,cpu-cores=6-9": "names core(s) 8-9, but this server may only run on cores 0-7",
        "x,cpu-cores=two": "'two' is neither a core id nor a <low>-<high> range",
        "x": "is not <name>,<setting>=<value>",
        "x,cpu-cores": "is not <name>,<setting>=<value>",
        ",cpu-cores=1": "is not <name>,<setting>=<value>",
    }
    for entry, message in cases.items():
        with pytest.raises(ValueError) as info:
            build_host_policies([entry], EIGHT, TWO_NODES)
        assert message in str(info.value), entry


def test_a_machine_without_numa_nodes_takes_node_0_and_leaves_memory_unbound() -> None:
    policies = build_host_policies(["p,numa-node=0"], {0, 1}, None)
    assert policies["p"].numa_node == 0 and not policies["p"].bind_memory and policies["p"].cores() == ()
    with pytest.raises(ValueError, match="numa-node 1 does not exist"):
        build_host_policies(["p,numa-node=1"], {0, 1}, None)


def test_bad_values_stop_the_server_at_start(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--host-policy=cpu,cpu-cores=0-4096"])
    assert info.value.code == 2
    assert "--host-policy: host policy 'cpu': cpu-cores '0-4096' names core(s)" in capsys.readouterr().err
    usable = sorted(os.sched_getaffinity(0))
    config = parse_args([f"--host-policy=cpu,cpu-cores={usable[0]}", "--host-policy", "gpu_0,numa-node=0"])
    assert config.host_policies["cpu"].cores() == (usable[0],)
    assert config.host_policies["gpu_0"].numa_node == 0


def test_default_names_and_the_worker_placement_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [default_policy_name(k, 3) for k in ("CPU", "GPU", "MODEL")] == ["cpu", "gpu_3", "model"]
    assert placement_env((), None) == {}
    monkeypatch.setenv(PLACEMENT_ENV, placement_env((1, 2), 0)[PLACEMENT_ENV])
    assert take_placement() == ([1, 2], 0)
    assert PLACEMENT_ENV not in os.environ  # removed: the model's own subprocesses do not inherit it
    monkeypatch.setenv(PLACEMENT_ENV, placement_env((), 1)[PLACEMENT_ENV])
    assert take_placement() == ([], 1)
