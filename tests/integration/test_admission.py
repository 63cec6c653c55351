"""Admission limits (--max-inflight-requests, --max-inflight-requests-per-model) refuse requests above the bound
with UNAVAILABLE and admit again once requests finish; --grpc-max-connection-age ends old connections."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import copy_example, write_model
from tests.integration.models import elementwise_py, python_config

SLOW_PY = elementwise_py(setup="time.sleep(1.5)")


def _slow_config(name: str) -> str:
    one = [("INPUT0", "TYPE_FP32", [1])], [("OUTPUT0", "TYPE_FP32", [1])]
    return python_config(name, *one, extra="instance_group [ { count: 4 kind: KIND_CPU } ]")


def _repo(tmp_path: Path) -> Path:
    for name in ("slow_a", "slow_b"):
        write_model(tmp_path, name, _slow_config(name), SLOW_PY)
    copy_example(tmp_path, "identity_fp32")
    return tmp_path


def _fire(client: grpcclient.InferenceServerClient, models: list[str]) -> list[Any]:
    """Send one request per entry at once; results (array or exception) in the same order."""
    results: list[Any] = [None] * len(models)
    done = threading.Semaphore(0)
    x = grpcclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.ones(1, np.float32))
    for i, model in enumerate(models):

        def callback(result: Any, error: Any, i: int = i) -> None:
            results[i] = error if error is not None else result.as_numpy("OUTPUT0")
            done.release()

        client.async_infer(model, [x], callback)
    for _ in models:
        assert done.acquire(timeout=60)
    return results


def _refused(results: list[Any]) -> list[str]:
    return [r.message() for r in results if isinstance(r, InferenceServerException)]


def test_server_wide_bound(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server([_repo(tmp_path)], ["--max-inflight-requests=2"])
    client = grpcclient.InferenceServerClient(server.url)
    results = _fire(client, ["slow_a", "slow_b", "slow_a", "slow_b", "slow_a"])
    refused = _refused(results)
    assert len(refused) == 3, results
    assert all(m.startswith("Server is busy: 2 inference requests in flight") for m in refused), refused
    assert all(isinstance(r, InferenceServerException) or r.tolist() == [1.0] for r in results)
    # the bound is free again once the admitted requests finished
    assert _refused(_fire(client, ["slow_a", "slow_b"])) == []
    client.close()


def test_stream_requests_count_and_are_refused_in_band(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server([_repo(tmp_path)], ["--max-inflight-requests=1"])
    client = grpcclient.InferenceServerClient(server.url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(lambda result, error: results.put(error if error is not None else result))
    x = grpcclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.ones(1, np.float32))
    for i in range(2):
        client.async_stream_infer("slow_a", [x], request_id=str(i))
    got = [results.get(timeout=30) for _ in range(2)]
    client.stop_stream()
    errors = [g for g in got if isinstance(g, InferenceServerException)]
    assert len(errors) == 1 and errors[0].message().startswith("Server is busy: 1 inference requests in flight")
    assert [g.as_numpy("OUTPUT0").tolist() for g in got if g not in errors] == [[1.0]]
    client.close()


def test_per_model_bound(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server([_repo(tmp_path)], ["--max-inflight-requests-per-model=1"])
    client = grpcclient.InferenceServerClient(server.url)
    results = _fire(client, ["slow_a", "slow_b", "slow_a"])
    assert results[1].tolist() == [1.0]  # another model: its own bound
    assert sorted(isinstance(r, InferenceServerException) for r in (results[0], results[2])) == [False, True]
    assert _refused(results) == [
        "Model 'slow_a' version 1 is busy: 1 inference requests in flight, the limit set by "
        "--max-inflight-requests-per-model; retry later"
    ]
    client.close()


def _stream_requests(feed: queue.Queue[Any]) -> Iterator[pb.ModelInferRequest]:
    while (item := feed.get()) is not None:
        yield item


def test_max_connection_age_ends_old_connections(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(args=["--grpc-max-connection-age=1000", "--grpc-max-connection-age-grace=500"])
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(np.ones(16, np.float32).tobytes())
    with grpc.insecure_channel(server.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        feed: queue.Queue[Any] = queue.Queue()
        replies = stub.ModelStreamInfer(_stream_requests(feed))
        feed.put(request)
        assert next(replies).error_message == ""
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            next(replies)  # the stream stays idle until the connection reaches its age plus grace
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert 1.0 <= time.monotonic() - started < 20
        feed.put(None)
        assert stub.ServerLive(pb.ServerLiveRequest()).live  # a new connection serves
