"""The one ModelInfer path of the gRPC servicer: plain, traced (--trace-config) and stage-timed calls all take
the large-message serialiser above LARGE_BYTES (the traced path used to skip it), traces end also on errors.

The servicer runs against a small engine double (the engine itself is covered elsewhere): the tracer, the
codec, the large-message serialiser and the observers are the real ones."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from protos import grpc_service_pb2 as pb
from service.core.observability.trace_settings import TraceSettings
from service.core.observability.tracer import Tracer
from service.errors import ErrorCode, ServiceError
from service.frontend.grpc import large as grpc_large
from service.frontend.grpc import observers
from service.frontend.grpc.handlers import HandlerFactory
from service.frontend.grpc.server import InferenceServicer
from service.ipc import stagetrace
from service.types import InferRequest, InferResponse, OutputTensor


class _Engine:
    """infer() answers with `nbytes` of output (or raises `error`); the rest is what ModelInfer reads."""

    def __init__(self, tracer: Tracer, nbytes: int, error: Exception | None = None, parameters: bool = False) -> None:
        self.tracer = tracer
        self.nbytes = nbytes
        self.error = error
        self.parameters = parameters
        self.seen: list[InferRequest] = []

    async def infer(self, request: InferRequest) -> InferResponse:
        self.seen.append(request)
        if request.trace is not None:
            request.trace.stamp("REQUEST_START")
        if self.error is not None:
            raise self.error
        data = np.arange(self.nbytes, dtype=np.uint8).tobytes()
        out = OutputTensor("OUT", "UINT8", [self.nbytes], data)
        resp = InferResponse(request.model_name, "1", request.id, outputs=[out])
        if self.parameters:
            resp.parameters["sequence_id"] = 5
        return resp


class _Aborted(Exception):
    pass


class _Context:
    def __init__(self) -> None:
        self.aborted: tuple[Any, str] | None = None

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: Any, message: str) -> None:
        self.aborted = (code, message)
        raise _Aborted(message)


def _request() -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m", id="r1")
    msg.inputs.add(name="IN", datatype="UINT8", shape=[4])
    msg.raw_input_contents.append(b"\x01\x02\x03\x04")
    return msg


def _tracer(tmp_path: Path, on: bool) -> Tracer:
    settings = (
        TraceSettings(level=("TIMESTAMPS",), rate=1, file=str(tmp_path / "trace.json")) if on else TraceSettings()
    )
    tracer = Tracer(settings)
    assert tracer.enabled == on
    return tracer


def _call(engine: _Engine, context: _Context | None = None) -> Any:
    servicer = InferenceServicer(engine, HandlerFactory(frozenset()))  # type: ignore[arg-type]
    return asyncio.run(servicer.ModelInfer(_request(), context or _Context()))


def _outputs(answer: Any) -> bytes:
    msg = pb.ModelInferResponse.FromString(answer) if isinstance(answer, bytes) else answer
    return bytes(msg.raw_output_contents[0])


def _trace_names(tmp_path: Path, tracer: Tracer) -> list[str]:
    tracer.close()
    records = json.loads((tmp_path / "trace.json").read_bytes())
    return [stamp["name"] for r in records if "timestamps" in r for stamp in r["timestamps"]]


@pytest.mark.parametrize("traced", [False, True])
def test_a_large_response_takes_the_large_message_path_traced_or_not(tmp_path: Path, traced: bool) -> None:
    nbytes = grpc_large.LARGE_BYTES + 4096
    engine = _Engine(_tracer(tmp_path, traced), nbytes)
    answer = _call(engine)
    assert isinstance(answer, bytes), "above LARGE_BYTES the response is pre-serialised by grpc_large"
    assert _outputs(answer) == np.arange(nbytes, dtype=np.uint8).tobytes()
    if traced:
        names = _trace_names(tmp_path, engine.tracer)
        assert names[:2] == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"]
        assert names[-2:] == ["GRPC_SEND_START", "GRPC_SEND_END"]


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("parameters", [False, True])
def test_a_small_response_is_written_plain_or_by_protobuf(tmp_path: Path, traced: bool, parameters: bool) -> None:
    engine = _Engine(_tracer(tmp_path, traced), 16, parameters=parameters)
    answer = _call(engine)
    # without parameters the response is written at the wire level (grpc/wire.py), else it is a protobuf message
    assert isinstance(answer, pb.ModelInferResponse if parameters else bytes)
    assert _outputs(answer) == bytes(range(16))
    assert (engine.seen[0].trace is not None) == traced


def test_a_failed_traced_call_aborts_and_still_finishes_its_trace(tmp_path: Path) -> None:
    engine = _Engine(_tracer(tmp_path, True), 16, ServiceError(ErrorCode.NOT_FOUND, "no such model"))
    context = _Context()
    with pytest.raises(_Aborted):
        _call(engine, context)
    assert context.aborted == (grpc.StatusCode.NOT_FOUND, "no such model")
    names = _trace_names(tmp_path, engine.tracer)
    assert "GRPC_WAITREAD_END" in names and "GRPC_SEND_START" not in names


def test_stage_timestamps_cover_the_large_message_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = stagetrace.Recorder(str(tmp_path / "stages.jsonl"))
    monkeypatch.setattr(stagetrace, "RECORDER", recorder)
    engine = _Engine(_tracer(tmp_path, True), grpc_large.LARGE_BYTES + 1)
    answer = _call(engine)
    recorder.close()
    assert isinstance(answer, bytes)
    stamps = [json.loads(line) for line in (tmp_path / "stages.jsonl").read_text().splitlines()]
    assert [name for name, _ns in stamps[0]] == ["handler", "decoded", "resumed", "encoded"]
    assert engine.seen[0].trace is not None  # Triton tracing runs beside the stage timestamps


def test_no_observers_when_nothing_traces(tmp_path: Path) -> None:
    engine = _Engine(_tracer(tmp_path, False), 1)
    assert observers.infer_observers(engine, _Context()) == ()  # type: ignore[arg-type]
