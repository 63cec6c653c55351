"""Ensemble graph validation (service.core.scheduling.ensemble_graph) on config protos, and the load barrier."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf import text_format

from protos import model_config_pb2 as mc
from service.core.scheduling.ensemble import LoadBarrier
from service.core.scheduling.ensemble_graph import Step, validate_graph, validate_models
from service.errors import ServiceError


def config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def ensemble(
    steps: str, outputs: str = 'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]'
) -> mc.ModelConfig:
    return config(
        f"""name: "e" platform: "ensemble" max_batch_size: 8
        input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ] {outputs}
        ensemble_scheduling {{ step [ {steps} ] }}"""
    )


def step(model: str, inp: str, out: str) -> str:
    return (
        f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "x" value: "{inp}" }} '
        f'output_map {{ key: "y" value: "{out}" }} }}'
    )


def model(dtype: str = "TYPE_FP32", dims: str = "4", mbs: int = 8, out_dims: str = "4") -> mc.ModelConfig:
    return config(
        f"""name: "m" backend: "python" max_batch_size: {mbs}
        input [ {{ name: "x" data_type: {dtype} dims: [ {dims} ] }} ]
        output [ {{ name: "y" data_type: TYPE_FP32 dims: [ {out_dims} ] }} ]"""
    )


def error_of(fn, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ServiceError) as exc:
        fn(*args)
    return exc.value.message


def test_valid_diamond_graph() -> None:
    steps = validate_graph(
        ensemble(
            ", ".join([step("a", "IN", "t1"), step("b", "t1", "t2"), step("c", "t1", "t3"), step("d", "t2", "OUT")])
        )
    )
    assert [s.model_name for s in steps] == ["a", "b", "c", "d"]
    assert steps[1] == Step(1, "b", "", {"x": "t1"}, {"y": "t2"})


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ("", "'ensemble_scheduling' must have at least one step"),
        (step("e", "IN", "OUT"), "step 0 (model 'e') refers to the ensemble itself"),
        (
            step("a", "IN", "IN") + ", " + step("b", "IN", "OUT"),
            "maps to ensemble tensor 'IN', which is an ensemble input",
        ),
        (step("a", "IN", "OUT") + ", " + step("b", "IN", "OUT"), "step 0 (model 'a') already produces"),
        (step("a", "t9", "OUT"), "step 0 (model 'a') input 'x' reads ensemble tensor 't9'"),
        (step("a", "IN", "t1"), "ensemble output 'OUT' is not produced by any step"),
        (
            step("a", "IN", "t0")
            + ", "
            + step("b", "t2", "t1")
            + ", "
            + step("c", "t1", "t2")
            + ", "
            + step("d", "t0", "OUT"),
            "the steps form a cycle: step 1 (model 'b') reads 't2' -> step 2 (model 'c') reads 't1' from step 1",
        ),
    ],
)
def test_graph_errors(steps: str, message: str) -> None:
    text = error_of(validate_graph, ensemble(steps))
    assert text.startswith("ensemble 'e': ") and message in text, text


def test_unused_input() -> None:
    cfg = ensemble(step("a", "t0", "OUT"))
    cfg.input.add(name="t0", data_type=mc.TYPE_FP32, dims=[4])
    assert "ensemble input 'IN' is not used by any step" in error_of(validate_graph, cfg)


@pytest.mark.parametrize(
    ("sub", "message"),
    [
        (
            model(dtype="TYPE_INT32"),
            "ensemble tensor 'IN' is TYPE_FP32 from ensemble input 'IN' but TYPE_INT32 for step 0",
        ),
        (
            model(dims="5"),
            "ensemble tensor 'IN' has shape [-1, 4] from ensemble input 'IN' but step 0 (model 'a') input 'x' "
            "expects [-1, 5]",
        ),
        (model(mbs=4), "ensemble max_batch_size 8 is larger than step 0 (model 'a') max_batch_size 4"),
        (model(out_dims="2"), "ensemble tensor 'OUT' has shape [-1, 2] from step 0 (model 'a') output 'y'"),
    ],
)
def test_model_checks(sub: mc.ModelConfig, message: str) -> None:
    cfg = ensemble(step("a", "IN", "OUT"))
    text = error_of(validate_models, cfg, validate_graph(cfg), lambda s: sub)
    assert message in text, text


def test_model_checks_accept_wildcards_and_report_missing_models() -> None:
    cfg = ensemble(step("a", "IN", "OUT"))
    validate_models(cfg, validate_graph(cfg), lambda s: model(dims="-1", out_dims="-1"))

    def missing(s: Step) -> mc.ModelConfig:
        raise ServiceError(2, "Request for unknown model: 'a' is not found")  # type: ignore[arg-type]

    assert "step 0 (model 'a') is not available: Request for unknown model" in error_of(
        validate_models, cfg, validate_graph(cfg), missing
    )


def test_load_barrier_waits_and_breaks_cycles() -> None:
    async def scenario() -> list[str]:
        barrier = LoadBarrier()
        loading = {"m"}
        order: list[str] = []

        async def ensemble_load() -> None:
            await barrier.wait("e", {"m"}, lambda n: n in loading)
            order.append("e")

        task = asyncio.create_task(ensemble_load())
        await asyncio.sleep(0)
        order.append("m")
        loading.discard("m")
        barrier.notify()
        await task
        # two ensembles that use each other: the second does not wait for the first
        first = asyncio.create_task(barrier.wait("x", {"y"}, lambda n: True))
        await asyncio.sleep(0)
        await asyncio.wait_for(barrier.wait("y", {"x"}, lambda n: True), 1)
        first.cancel()
        return order

    assert asyncio.run(scenario()) == ["m", "e"]
