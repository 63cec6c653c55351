"""A ModelStreamInfer stream whose responses are not read holds a bounded amount: the server stops reading its
requests once --grpc-stream-buffer-bytes of responses wait, and serves every one once the client reads."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tests.conftest import EXAMPLE_REPO, ServerProcess, running_server

ELEMENTS = 64 * 1024  # 256 KiB per request and per response
COUNT = 200  # 50 MiB each way


def _requests(stop: threading.Event) -> Iterator[pb.ModelInferRequest]:
    for i in range(COUNT):
        msg = pb.ModelInferRequest(model_name="identity_fp32_any", id=str(i))
        msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1, ELEMENTS])
        msg.raw_input_contents.append(np.full(ELEMENTS, i, np.float32).tobytes())
        if stop.is_set():
            return
        yield msg


def _executed(stub: pb_grpc.GRPCInferenceServiceStub) -> int:
    stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name="identity_fp32_any"))
    return int(stats.model_stats[0].inference_count)


def _settled(stub: pb_grpc.GRPCInferenceServiceStub, quiet_s: float = 1.0, limit_s: float = 30.0) -> int:
    """The executed count once it stopped moving for quiet_s."""
    last, since = -1, time.monotonic()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        now = _executed(stub)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now
        time.sleep(0.1)
    return last


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("srv") / "server.log"
    with running_server([EXAMPLE_REPO], log, ["--grpc-stream-buffer-bytes=1048576"]) as s:
        yield s


def test_unread_stream_is_bounded_and_then_served(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        stop = threading.Event()
        executed_before = _executed(stub)
        responses = stub.ModelStreamInfer(_requests(stop))  # nothing is read yet
        executed = _settled(stub) - executed_before
        # 1 MiB of buffered responses plus what HTTP/2 windows hold: far below the 200 requests sent. With
        # front-end processes the core's link to the front end buffers too (116 seen once under heavy load)
        bound = COUNT * 3 // 4 if int(os.environ.get("TRIREME_FRONTEND_PROCESSES", "1") or 1) > 1 else COUNT // 2
        assert 0 < executed < bound, executed
        got = []
        for r in responses:
            assert r.error_message == ""
            got.append(r)
            if len(got) == COUNT:
                break
        responses.cancel()
    assert [r.infer_response.id for r in got] == [str(i) for i in range(COUNT)]
    for i, r in enumerate(got):
        assert np.all(np.frombuffer(r.infer_response.raw_output_contents[0], np.float32) == i)


def test_cancelled_unread_stream_leaves_the_server_serving(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        stop = threading.Event()
        responses = stub.ModelStreamInfer(_requests(stop))
        before = _settled(stub)
        stop.set()
        responses.cancel()
        after = _settled(stub)
        assert after - before <= 8  # what was already queued may finish; nothing new is read
        # a new stream on the same server is served at once
        reply = next(iter(stub.ModelStreamInfer(iter(list(_requests(threading.Event()))[:1]))))
        assert reply.error_message == "" and reply.infer_response.id == "0"
