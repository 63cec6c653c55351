"""The rate limiter's resource arithmetic and ordering, driven by hand (the timestamped proof through a real
server is tests/integration/test_rate_limiter.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from google.protobuf import text_format

from protos import model_config_pb2 as mc
from service.config.groups.rate_limit import ResourceLimit, parse_resource
from service.core.scheduling.rate_limiter import RateLimiter
from service.errors import ServiceError


def config(groups: str) -> mc.ModelConfig:
    return text_format.Parse(groups, mc.ModelConfig())


def worker(name: str, group: str, device: int = 0) -> Any:
    return SimpleNamespace(spec=SimpleNamespace(instance_name=name, group_name=group, device_id=device))


GROUP = (
    'instance_group [ {{ name: "g" rate_limiter {{ resources [ {{ name: "R" count: {n} {g} }} ] priority: {p} }} }} ]'
)


def group(n: int, p: int = 0, is_global: bool = False) -> mc.ModelConfig:
    return config(GROUP.format(n=n, p=p, g="global: true" if is_global else ""))


def test_default_counts_are_the_largest_request_and_limit_concurrency() -> None:
    rl = RateLimiter()
    a, b = object(), object()
    wa, wb = worker("g_0", "g"), worker("g_0", "g")
    rl.add_model(a, group(1), [wa])
    rl.add_model(b, group(2), [wb])
    assert rl.available == {(0, "R"): 2}
    ran: list[str] = []
    rl.admit(b, wb, ["b1"], lambda w, batch: ran.extend(batch))
    rl.admit(a, wa, ["a1"], lambda w, batch: ran.extend(batch))
    assert ran == ["b1"]  # b holds both copies; a waits
    rl.release(b, wb)
    assert ran == ["b1", "a1"]


def test_explicit_counts_fail_an_instance_that_needs_more() -> None:
    rl = RateLimiter([ResourceLimit("R", 1)])
    with pytest.raises(ServiceError) as e:
        rl.add_model(object(), group(2), [worker("g_0", "g")])
    assert e.value.message == (
        'Resource count for "R" is limited to 1 which will prevent scheduling of one or more model instances, '
        "the minimum required count is 2"
    )
    assert rl.instances == {}  # nothing registered
    with pytest.raises(ServiceError, match="limited to 0"):  # a resource the flags do not name has none
        RateLimiter([ResourceLimit("OTHER", 5)]).add_model(object(), group(1), [worker("g_0", "g")])


def test_device_resources_are_counted_per_device_and_global_ones_once() -> None:
    rl = RateLimiter([ResourceLimit("R", 1, 0), ResourceLimit("R", 2, 1)])
    owner = object()
    w0, w1, w1b = worker("g_0_0", "g", 0), worker("g_1_0", "g", 1), worker("g_1_1", "g", 1)
    rl.add_model(owner, group(1), [w0, w1, w1b])
    ran: list[Any] = []
    for w in (w0, w1, w1b):
        rl.admit(owner, w, [w.spec.instance_name], lambda w, batch: ran.extend(batch))
    assert ran == ["g_0_0", "g_1_0", "g_1_1"]  # device 1 has two copies, device 0 one: all three run
    g = RateLimiter()
    g.add_model(owner, group(1, is_global=True), [w0, w1])
    g.admit(owner, w0, ["x"], lambda w, batch: ran.append("x"))
    g.admit(owner, w1, ["y"], lambda w, batch: ran.append("y"))
    assert ran[-1] == "x"  # one global copy: the instance on the other device waits
    g.release(owner, w0)
    assert ran[-1] == "y"
    with pytest.raises(ServiceError, match="present as both global and device-specific"):
        g.add_model(object(), group(1), [worker("g_0", "g")])


def test_priority_weighs_executions() -> None:
    # priority 1 vs priority 3: after each has run once, the first comes before the second (1 x 1 < 1 x 3)
    rl = RateLimiter()
    fast, slow, hog = object(), object(), object()
    wf, ws, wh = worker("g_0", "g"), worker("g_0", "g"), worker("g_0", "g")
    rl.add_model(fast, group(1, p=1), [wf])
    rl.add_model(slow, group(1, p=3), [ws])
    rl.add_model(hog, group(1), [wh])
    order: list[str] = []

    def run(name: str) -> Any:
        return lambda w, batch: order.append(name)

    rl.admit(hog, wh, [1], run("hog"))  # holds R
    rl.admit(slow, ws, [1], run("slow"))
    rl.admit(fast, wf, [1], run("fast"))
    rl.release(hog, wh)  # both at 0 executions: the one staged first wins
    rl.release(slow, ws)
    assert order == ["hog", "slow", "fast"]
    rl.release(fast, wf)
    rl.admit(hog, wh, [2], run("hog"))  # holds R again
    rl.admit(slow, ws, [2], run("slow"))  # 1 execution x priority 3
    rl.admit(fast, wf, [2], run("fast"))  # 1 execution x priority 1: goes first though staged later
    rl.release(hog, wh)
    assert order[-1] == "fast"
    rl.release(fast, wf)
    assert order[-1] == "slow"


def test_resource_flag_parsing_uses_tritons_messages() -> None:
    assert parse_resource("R1:10") == ResourceLimit("R1", 10)
    assert parse_resource("R2:5:1") == ResourceLimit("R2", 5, 1)
    with pytest.raises(ValueError, match=r"format is '<resource_name>:<count>:<device>' or"):
        parse_resource("R1")
    with pytest.raises(ValueError, match=r"Invalid option value\. Got x"):
        parse_resource("R1:x")
