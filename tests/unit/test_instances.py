"""service/instances: a real worker process (spawned, fed a batch through the input arena and inline, answering
through the output arena), a crash failing what it held, and the pool restarting a crashed instance."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
from pathlib import Path

import numpy as np

from protos import model_config_pb2 as mc
from service.core.repository import model_config as cfg
from service.instances.pool import InstancePool
from service.instances.process import InstanceSpec, WorkerProcess
from service.ipc import frames as ipc
from service.types import InferRequest, InferResponse, InputTensor

MODEL_PY = """
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            if x.size and x.flat[0] < 0:
                os._exit(7)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
        return out
"""


def _spec(tmp_path: Path, name: str = "double_0") -> InstanceSpec:
    version_dir = tmp_path / "double" / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "model.py").write_text(textwrap.dedent(MODEL_PY))
    config = mc.ModelConfig(name="double", backend="python")
    config.input.add(name="IN", data_type=mc.TYPE_FP32, dims=[-1])
    config.output.add(name="OUT", data_type=mc.TYPE_FP32, dims=[-1])
    return InstanceSpec(
        backend="python",
        model_name="double",
        model_version="1",
        model_dir=str(tmp_path / "double"),
        version_dir=str(version_dir),
        config_json=cfg.to_json(config),
        instance_name=name,
        arena_bytes=4 << 20,
        arena_growth_bytes=4 << 20,
    )


def _request(x: np.ndarray, answers: list[InferResponse]) -> InferRequest:
    req = InferRequest("double", "1", "r", inputs=[InputTensor("IN", "FP32", list(x.shape), x.tobytes())])
    req.on_response = answers.append
    return req


async def _run(worker: WorkerProcess, requests: list[InferRequest]) -> ipc.ExecDone | None:
    done: asyncio.Future[ipc.ExecDone | None] = asyncio.get_running_loop().create_future()
    worker.execute(requests, lambda w, message: done.set_result(message))
    return await asyncio.wait_for(done, 30)


def test_a_worker_runs_a_batch_inline_and_through_the_arenas(tmp_path: Path) -> None:
    async def main() -> None:
        worker = WorkerProcess(_spec(tmp_path))
        await worker.start()
        try:
            assert worker.alive and worker.pid is not None
            small = np.arange(4, dtype=np.float32)  # inline in the frame
            large = np.arange(ipc.INLINE_LIMIT, dtype=np.float32)  # 256 KiB: through the input arena
            answers: list[InferResponse] = []
            message = await _run(worker, [_request(small, answers), _request(large, answers)])
            assert isinstance(message, ipc.ExecDone)
            assert [a.error for a in answers] == [None, None]
            got = [np.frombuffer(bytes(a.outputs[0].data or b""), np.float32) for a in answers]
            assert np.array_equal(got[0], small * 2) and np.array_equal(got[1], large * 2)
            assert worker.bytes_copied == small.nbytes + large.nbytes
            assert not worker.inflight and not worker.batches
        finally:
            await worker.stop()
        assert worker.exited and worker.proc is not None and worker.proc.returncode is not None

    asyncio.run(main())


def test_a_crash_fails_the_requests_in_flight_and_calls_on_exit(tmp_path: Path) -> None:
    async def main() -> None:
        exited: list[WorkerProcess] = []
        worker = WorkerProcess(_spec(tmp_path), on_exit=exited.append)
        await worker.start()
        answers: list[InferResponse] = []
        message = await _run(worker, [_request(np.array([-1.0], np.float32), answers)])
        assert message is None  # the batch ended with the worker
        (answer,) = answers
        assert answer.error is not None and "exit status 7" in answer.error.message
        assert "double_0" in answer.error.message
        assert exited == [worker] and not worker.alive
        await worker.kill()

    asyncio.run(main())


def test_the_pool_restarts_a_killed_instance(tmp_path: Path) -> None:
    async def main() -> None:
        pool = InstancePool([_spec(tmp_path, "double_0"), _spec(tmp_path, "double_1")])
        available: list[WorkerProcess] = []
        pool.on_available = available.append
        await pool.start()
        try:
            assert pool.ready and len(pool.workers) == 2
            first = pool.workers[0]
            assert first.pid is not None
            os.kill(first.pid, signal.SIGKILL)
            for _ in range(300):
                if available:
                    break
                await asyncio.sleep(0.1)
            (fresh,) = available
            assert fresh is not first and fresh.alive and pool.restarts == 1
            assert pool.workers[0] is fresh and pool.ready
            answers: list[InferResponse] = []
            await _run(fresh, [_request(np.ones(3, np.float32), answers)])
            assert np.frombuffer(bytes(answers[0].outputs[0].data or b""), np.float32).tolist() == [2.0, 2.0, 2.0]
        finally:
            await pool.stop(5.0)
        assert pool.workers == []

    asyncio.run(main())
