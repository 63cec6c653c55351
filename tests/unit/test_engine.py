"""service/core/engine: the façade over a real repository with one Python model (a real worker process):
inference, metadata, readiness, Triton's errors, and client shared memory held until the final response."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import posix_ipc
import pytest

from service.core.engine import Engine
from service.core.repository.repository import ModelRepository, RepositoryOptions
from service.core.scheduling.factory import make_scheduler
from service.errors import ErrorCode, ServiceError
from service.types import InferRequest, InputTensor, RequestedOutput, ShmRef
from shm.registry import SharedMemoryRegistry
from tests.integration.models import elementwise_py, python_config

CONFIG = python_config("double", [("IN", "TYPE_FP32", [-1])], [("OUT", "TYPE_FP32", [-1])])
MODEL_PY = elementwise_py("x * 2", inp="IN", out="OUT")


def _repo(tmp_path: Path) -> Path:
    (tmp_path / "double" / "1").mkdir(parents=True)
    (tmp_path / "double" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "double" / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY))
    return tmp_path


def _run(tmp_path: Path, test: Callable[[Engine], Awaitable[None]]) -> None:
    async def main() -> None:
        engine: Engine | None = None
        repository = ModelRepository(
            [str(_repo(tmp_path))],
            RepositoryOptions(gpu_count=0, arena_bytes=1 << 20),
            lambda mv, pool: make_scheduler(mv, pool, engine),
        )
        engine = Engine(repository, SharedMemoryRegistry())
        await repository.load_all()
        try:
            await test(engine)
        finally:
            await repository.stop()

    asyncio.run(main())


def _request(x: np.ndarray) -> InferRequest:
    return InferRequest("double", "", "r1", inputs=[InputTensor("IN", "FP32", list(x.shape), x.tobytes())])


def test_infer_metadata_and_readiness(tmp_path: Path) -> None:
    async def test(engine: Engine) -> None:
        assert engine.server_ready() and await engine.model_ready("double") and not engine.is_decoupled("double")
        meta = engine.model_metadata("double")
        assert meta.versions == ["1"] and [t.name for t in meta.inputs] == ["IN"]
        response = await engine.infer(_request(np.arange(3, dtype=np.float32)))
        assert response.error is None and response.model_version == "1"
        assert np.frombuffer(bytes(response.outputs[0].data or b""), np.float32).tolist() == [0.0, 2.0, 4.0]
        ((name, version, stats),) = engine.statistics("double")
        assert (name, version, stats.success.count) == ("double", "1", 1)

    _run(tmp_path, test)


def test_triton_s_errors(tmp_path: Path) -> None:
    async def test(engine: Engine) -> None:
        with pytest.raises(ServiceError) as e:
            engine.prepare(InferRequest("nope", "", ""))
        assert e.value.code == ErrorCode.NOT_FOUND
        bad = _request(np.arange(3, dtype=np.float32))
        bad.inputs[0].datatype = "INT32"
        with pytest.raises(ServiceError) as e:
            await engine.infer(bad)
        assert e.value.code == ErrorCode.INVALID_ARG and "INT32" in e.value.message
        with pytest.raises(ServiceError) as e:
            await engine.load_model("double")  # model control mode "none"
        assert e.value.code == ErrorCode.UNAVAILABLE
        engine.accepting = False
        with pytest.raises(ServiceError) as e:
            engine.prepare(_request(np.zeros(1, np.float32)))
        assert e.value.code == ErrorCode.UNAVAILABLE and "shutting down" in e.value.message

    _run(tmp_path, test)


def test_client_shm_inputs_and_outputs_are_held_until_the_final_response(tmp_path: Path) -> None:
    key = f"/trireme_engine_test_{tmp_path.name[-12:]}"
    segment = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=64)
    try:

        async def test(engine: Engine) -> None:
            registry = engine.client_shm()
            registry.register_system("region", key, 0, 64)
            with open(f"/dev/shm{key}", "r+b") as f:
                f.write(np.array([1, 2, 3, 4], np.float32).tobytes())
            req = InferRequest("double", "", "r2")
            req.inputs = [InputTensor("IN", "FP32", [4], None, ShmRef("region", "", "", 0, 16))]
            req.outputs = [RequestedOutput("OUT", shm=ShmRef("region", "", "", 32, 16))]
            released: list[str] = []
            release = registry.release
            registry.release = lambda r: (released.append(r.name), release(r))  # type: ignore[method-assign]
            response = await engine.infer(req)
            assert response.error is None and response.outputs[0].data is None  # written into the region
            with open(f"/dev/shm{key}", "rb") as f:
                out = np.frombuffer(f.read()[32:48], np.float32)
            assert out.tolist() == [2.0, 4.0, 6.0, 8.0]
            assert released == ["region", "region"]  # both references dropped with the final response
            assert req not in engine.shm_holds
            with pytest.raises(ServiceError) as e:
                req2 = InferRequest("double", "", "r3")
                req2.inputs = [InputTensor("IN", "FP32", [4], None, ShmRef("region", "", "", 60, 16))]
                engine.prepare(req2)
            assert e.value.code == ErrorCode.INVALID_ARG

        _run(tmp_path, test)
    finally:
        segment.close_fd()
        segment.unlink()
