"""model_warmup: run the config's warmup samples on every instance before the model is READY (as Triton does)."""

from __future__ import annotations

import asyncio
import os

import numpy as np

from protos import model_config_pb2 as mc
from service.errors import ErrorCode, ServiceError
from service.instances.pool import InstancePool
from service.instances.process import WorkerProcess
from service.ipc import frames as ipc
from service.types import InferRequest, InferResponse, InputTensor
from shm.tensor import CONFIG_TO_DATATYPE, DATATYPE_TO_NUMPY, element_count, serialize_bytes


def sample_inputs(config: mc.ModelConfig, model_dir: str, sample: mc.ModelWarmup) -> list[InputTensor]:
    """The input tensors of one warmup sample (zero, random or file data; batch dim from batch_size)."""
    inputs = []
    for name, spec in sorted(sample.inputs.items()):
        datatype = CONFIG_TO_DATATYPE[mc.DataType.Name(spec.data_type)]
        shape = list(spec.dims)
        if config.max_batch_size > 0:
            shape = [max(1, sample.batch_size), *shape]
        count = element_count(shape)
        which = spec.WhichOneof("input_data_type")
        if which == "input_data_file":
            with open(os.path.join(model_dir, "warmup", spec.input_data_file), "rb") as f:
                data = f.read()
        elif datatype == "BYTES":
            data = serialize_bytes([b""] * count)
        elif which == "random_data":
            rng = np.random.default_rng(0)
            data = rng.random(count).astype(DATATYPE_TO_NUMPY[datatype]).tobytes()
        else:
            data = np.zeros(count, dtype=DATATYPE_TO_NUMPY[datatype]).tobytes()
        inputs.append(InputTensor(name, datatype, shape, data))
    return inputs


async def _run_once(worker: WorkerProcess, request: InferRequest) -> InferResponse:
    loop = asyncio.get_running_loop()
    response: asyncio.Future[InferResponse] = loop.create_future()
    done: asyncio.Future[None] = loop.create_future()

    def on_response(r: InferResponse) -> None:
        if r.final and not response.done():
            response.set_result(r)

    def on_done(_: WorkerProcess, __: ipc.ExecDone | None) -> None:
        if not done.done():
            done.set_result(None)

    request.on_response = on_response
    worker.execute([request], on_done)
    await done
    if not response.done():  # a decoupled model may answer after execute returns
        return await asyncio.wait_for(response, 60)
    return response.result()


async def run_warmup(config: mc.ModelConfig, model_dir: str, version: str, pool: InstancePool) -> None:
    """Every sample, `count` times (at least once), on every instance; any error fails the load."""
    for sample in config.model_warmup:
        try:
            inputs = sample_inputs(config, model_dir, sample)
        except (OSError, KeyError, ValueError) as e:
            raise ServiceError(ErrorCode.INVALID_ARG, f"failed to prepare warmup sample '{sample.name}': {e}") from None
        for worker in pool.workers:
            for _ in range(max(1, sample.count)):
                request = InferRequest(config.name, version, id=f"warmup_{sample.name}", inputs=list(inputs))
                response = await _run_once(worker, request)
                if response.error is not None:
                    raise ServiceError(
                        ErrorCode.INTERNAL,
                        f"failed to run warmup sample '{sample.name}': {response.error.message}",
                    )
