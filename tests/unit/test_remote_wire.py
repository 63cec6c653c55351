"""--frontend-processes: the flag's default and the frames between front-end processes and the core."""

from __future__ import annotations

import pickle

import pytest

from service.config.flags import parse_args
from service.core.observability.trace_settings import TraceSettings
from service.core.observability.tracer import Tracer
from service.errors import ErrorCode, ServiceError
from service.ipc.framing import FrameReader
from service.remote.tracing import END, CoreTraces, ForwardedTrace, RemoteTracer, TraceSwitch
from service.remote.wire import (
    forwarded_trace,
    frame,
    pack_error,
    pack_request,
    pack_response,
    unpack_error,
    unpack_request,
    unpack_response,
)
from service.types import InferRequest, InferResponse, InputTensor, OutputTensor, RequestedOutput, ShmRef
from shm.errors import ShmError


def test_flag_env_default_and_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIREME_FRONTEND_PROCESSES", "3")
    assert parse_args([]).frontend_processes == 3
    assert parse_args(["--frontend-processes", "2"]).frontend_processes == 2  # the flag wins
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("TRIREME_FRONTEND_PROCESSES")
    assert parse_args([]).frontend_processes == 1  # 2 cores: one process
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert parse_args([]).frontend_processes == 4
    with pytest.raises(SystemExit):
        parse_args(["--frontend-processes", "0"])


def test_request_and_response_round_trip_through_frames() -> None:
    ref = ShmRef("region", "system", "/key", 16, 64)
    request = InferRequest(
        "m",
        "1",
        "id-7",
        [InputTensor("A", "FP32", [2], memoryview(b"\x00" * 8)), InputTensor("B", "INT32", [16], shm=ref)],
        [RequestedOutput("Y", ref, 0), RequestedOutput("Z", None, 3)],
        {"p": 1, "q": "s"},
        sequence_id="seq",
        flags=1,
        priority=2,
        timeout_us=5,
        enable_empty_final=True,
    )
    response = InferResponse(
        "m", "1", "id-7", [OutputTensor("Y", "FP32", [2], memoryview(b"\x01" * 8))], {"k": True},
        ServiceError(ErrorCode.INVALID_ARG, "bad"), final=False, null=False, model_error=True,
    )  # fmt: skip
    messages: list[tuple] = []
    reader = FrameReader(pickle.loads, messages.append)
    data = frame(("i", 1, pack_request(request))) + frame(("r", 1, pack_response(response)))
    reader.feed(data[:5])  # a frame split across reads
    assert messages == []
    reader.feed(data[5:])
    assert [m[0] for m in messages] == ["i", "r"]
    got = unpack_request(messages[0][2])
    assert (got.model_name, got.model_version, got.id, got.parameters) == ("m", "1", "id-7", {"p": 1, "q": "s"})
    assert got.inputs[0].data == b"\x00" * 8 and got.inputs[1].shm == ref
    assert [(o.name, o.shm, o.classification) for o in got.outputs] == [("Y", ref, 0), ("Z", None, 3)]
    assert (got.sequence_id, got.flags, got.priority, got.timeout_us, got.enable_empty_final) == ("seq", 1, 2, 5, True)
    back = unpack_response(messages[1][2])
    assert back.outputs[0].data == b"\x01" * 8 and back.parameters == {"k": True}
    assert back.error is not None and (back.error.code, back.error.message) == (ErrorCode.INVALID_ARG, "bad")
    assert (back.final, back.null, back.model_error) == (False, False, True)


def test_errors_keep_type_code_and_message() -> None:
    e = unpack_error(pack_error(ServiceError(ErrorCode.NOT_FOUND, "no such model")))
    assert isinstance(e, ServiceError) and (e.code, e.message) == (ErrorCode.NOT_FOUND, "no such model")
    s = unpack_error(pack_error(ShmError("ALREADY_EXISTS", "taken")))
    assert isinstance(s, ShmError) and (s.code, s.message) == ("ALREADY_EXISTS", "taken")
    other = unpack_error(pack_error(RuntimeError("boom")))
    assert isinstance(other, ServiceError) and other.code == ErrorCode.INTERNAL and other.message == "boom"


def test_a_forwarded_trace_is_sampled_by_the_core_and_finished_with_the_front_ends_stamps() -> None:
    sent: list[tuple] = []
    switch = TraceSwitch()
    front = RemoteTracer(sent.append, TraceSwitch(switch.fd))
    assert not front.enabled and front.sample("m") is None
    switch.set(True)  # the core's tracer is on: every front end sees it
    assert front.enabled
    core = Tracer(TraceSettings(level=("TIMESTAMPS",), rate=1, count=1))
    traces = CoreTraces(lambda: core)
    packed = []
    for rid in (1, 2):
        trace = front.sample("m", "")
        assert isinstance(trace, ForwardedTrace)
        trace.stamp("GRPC_WAITREAD_START", 10)
        request = InferRequest("m", "", f"r{rid}", [], [])
        request.trace = trace
        packed.append((trace, pack_request(request, trace.forwarded(rid))))
    for rid, (_, p) in enumerate(packed, 1):
        request = unpack_request(p)
        forwarded = forwarded_trace(p)
        assert forwarded is not None and forwarded[1] == [("GRPC_WAITREAD_START", 10)]
        traces.begin(rid, request, forwarded)
        assert (request.trace is not None) == (rid == 1)  # trace_count 1: only the first is sampled
    assert not core.enabled
    for trace, _ in packed:
        trace.stamp("GRPC_SEND_END", 20)
        trace.finish()
        trace.finish()  # once only
    assert [m[:2] for m in sent] == [(END, 1), (END, 2)]
    for message in sent:
        traces.end(*message[1:])
    untraced = front.sample("m", "")
    assert isinstance(untraced, ForwardedTrace)
    untraced.forwarded(3)
    untraced.sampled = False  # the core's final response said it did not sample it: no end frame
    untraced.finish()
    assert len(sent) == 2
    records = core._done
    assert [r["timestamps"] for r in records if "timestamps" in r] == [
        [{"name": "GRPC_WAITREAD_START", "ns": 10}, {"name": "GRPC_SEND_END", "ns": 20}]
    ]
