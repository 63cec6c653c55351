"""Seeded fuzzing of ModelInfer, ModelStreamInfer, the shared-memory RPCs and HTTP inference bodies.

Each case is valid (its answer is checked), structurally invalid (random names, datatypes, shapes, contents,
parameters, shared-memory references) or not a message at all (mutated or random bytes). A case must be answered
within the deadline with a status; valid ones with the right data."""

from __future__ import annotations

import contextlib
import json
import random
import uuid
from typing import Any

import grpc
import numpy as np
import requests
from tritonclient.grpc import service_pb2 as pb

from tests.reliability.tally import Tally, Target

DEADLINE_S = 20.0
SERVICE = "/inference.GRPCInferenceService/"
MODELS = ["identity_fp32", "identity_fp32_any", "add_sub", "identity_bytes", "raise_error", "no_such_model", ""]
VERSIONS = ["", "", "1", "2", "-1", "\uff11", "abc", "99999999999999999999", " 1"]
DATATYPES = ["FP32", "FP32", "FP64", "INT32", "INT8", "UINT64", "BOOL", "BYTES", "FP16", "BF16", "", "NOPE"]
NAMES = ["INPUT0", "INPUT0", "INPUT1", "OUTPUT0", "", "x" * 300]
DIMS = [-2, -1, 0, 1, 1, 2, 4, 16, 16, 1 << 20, 1 << 40, (1 << 63) - 1]
CONTENTS = ["fp32_contents", "fp64_contents", "int_contents", "int64_contents", "uint_contents", "bool_contents"]
PARAM_KEYS = ["sequence_id", "sequence_start", "priority", "timeout", "triton_x", "custom", "binary_data_size"]
TENSOR_KEYS = ["shared_memory_region", "shared_memory_offset", "shared_memory_byte_size", "classification"]


def valid_request(rng: random.Random) -> tuple[pb.ModelInferRequest, np.ndarray]:
    """An identity_fp32 request with random data; the expected output."""
    data = np.asarray(rng.choices(range(-1000, 1000), k=16 * (batch := rng.randint(1, 8))), np.float32)
    data = data.reshape(batch, 16)
    msg = pb.ModelInferRequest(model_name="identity_fp32", id=uuid.uuid4().hex[:8])
    msg.inputs.add(name="INPUT0", datatype="FP32", shape=[batch, 16])
    msg.raw_input_contents.append(data.tobytes())
    return msg, data


def _set_param(p: pb.InferParameter, rng: random.Random) -> None:
    choice = rng.randrange(5)
    if choice == 0:
        p.bool_param = rng.random() < 0.5
    elif choice == 1:
        p.int64_param = rng.choice([-1, 0, 1, 1 << 62])
    elif choice == 2:
        p.uint64_param = rng.choice([0, 1, (1 << 64) - 1])
    elif choice == 3:
        p.string_param = rng.choice(["", "r", "region", "\x00", "x" * 1000])
    else:
        p.double_param = rng.choice([0.5, float("nan"), -1e300])


def invalid_request(rng: random.Random) -> pb.ModelInferRequest:
    """A structurally random request: names, versions, datatypes, shapes, data sizes, parameters."""
    msg = pb.ModelInferRequest(model_name=rng.choice(MODELS), model_version=rng.choice(VERSIONS), id=str(rng.random()))
    for _ in range(rng.randrange(3)):
        _set_param(msg.parameters[rng.choice(PARAM_KEYS)], rng)
    for _ in range(rng.randrange(4)):
        t = msg.inputs.add(name=rng.choice(NAMES), datatype=rng.choice(DATATYPES))
        t.shape.extend(rng.choice(DIMS) for _ in range(rng.randrange(5)))
        kind = rng.randrange(4)
        if kind == 0:
            values = rng.choices(range(-5, 5), k=rng.randrange(40))
            field = rng.choice(CONTENTS)
            getattr(t.contents, field).extend(
                [bool(v) for v in values]
                if field == "bool_contents"
                else [abs(v) for v in values]
                if field.startswith("uint")
                else values
            )
        elif kind == 1:
            msg.raw_input_contents.append(rng.randbytes(rng.choice([0, 1, 3, 64, 100, 4096])))
        elif kind == 2:
            for _ in range(rng.randrange(1, 3)):
                _set_param(t.parameters[rng.choice(TENSOR_KEYS)], rng)
    for _ in range(rng.randrange(3)):
        o = msg.outputs.add(name=rng.choice(NAMES))
        if rng.random() < 0.3:
            _set_param(o.parameters[rng.choice(TENSOR_KEYS)], rng)
    return msg


def garbage(rng: random.Random) -> bytes:
    """Bytes that are (usually) not a ModelInferRequest: a valid one mutated, truncated or random bytes."""
    raw = bytearray(valid_request(rng)[0].SerializeToString())
    kind = rng.randrange(3)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if kind == 1:
        return bytes(raw[: rng.randrange(1, len(raw))])
    return rng.randbytes(rng.randint(1, 300))


def _check(tally: Tally, code: grpc.StatusCode, details: str = "") -> None:
    tally.statuses[code.name] += 1
    tally.examples.setdefault(code.name, details)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        tally.hangs += 1


def fuzz_infer(target: Target, seed: int, count: int) -> Tally:
    """`count` ModelInfer cases: 1/5 valid (checked), 1/5 garbage bytes, the rest structurally invalid."""
    rng, tally = random.Random(seed), Tally()
    with grpc.insecure_channel(target.grpc_url) as channel:
        infer = channel.unary_unary(SERVICE + "ModelInfer")
        for _ in range(count):
            kind = rng.randrange(5)
            expected = None
            if kind == 0:
                msg, expected = valid_request(rng)
                body = msg.SerializeToString()
            elif kind == 1:
                body = garbage(rng)
            else:
                body = invalid_request(rng).SerializeToString()
            tally.cases += 1
            try:
                reply = pb.ModelInferResponse.FromString(infer(body, timeout=DEADLINE_S))
                _check(tally, grpc.StatusCode.OK)
                if expected is not None:
                    got = np.frombuffer(reply.raw_output_contents[0], np.float32).reshape(expected.shape)
                    tally.wrong += int(not np.array_equal(got, expected))
            except grpc.RpcError as e:
                _check(tally, e.code(), e.details() or "")
                tally.wrong += int(expected is not None)
    return tally


def fuzz_stream(target: Target, seed: int, count: int, per_stream: int = 50) -> Tally:
    """`count` cases over ModelStreamInfer streams of `per_stream`; each request must get exactly one answer."""
    rng, tally = random.Random(seed), Tally()
    with grpc.insecure_channel(target.grpc_url) as channel:
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer")
        done = 0
        while done < count:
            n = min(per_stream, count - done)
            done += n
            cases: list[tuple[str, np.ndarray | None]] = []
            bodies = []
            for i in range(n):
                if rng.randrange(3) == 0:
                    msg, data = valid_request(rng)
                else:
                    msg, data = invalid_request(rng), None
                msg.id = f"case-{i}"
                cases.append((msg.id, data))
                bodies.append(msg.SerializeToString())
            tally.cases += n
            answers: dict[str, int] = {}
            try:
                for raw in stream(iter(bodies), timeout=DEADLINE_S * 3):
                    reply = pb.ModelStreamInferResponse.FromString(raw)
                    rid = reply.infer_response.id
                    answers[rid] = answers.get(rid, 0) + 1
                    tally.statuses["stream-error" if reply.error_message else "stream-ok"] += 1
                    data = dict(cases).get(rid)
                    if data is not None:
                        got = (
                            np.frombuffer(reply.infer_response.raw_output_contents[0], np.float32)
                            if not reply.error_message and reply.infer_response.raw_output_contents
                            else None
                        )
                        tally.wrong += int(got is None or not np.array_equal(got.reshape(data.shape), data))
            except grpc.RpcError as e:
                _check(tally, e.code(), e.details() or "")
            tally.lost += sum(1 for rid, _ in cases if answers.get(rid, 0) != 1)
    return tally


def fuzz_shm(target: Target, seed: int, count: int) -> Tally:
    """Register/unregister/status with random names, keys, offsets and sizes (one real segment among them), and
    inferences that reference regions with random offsets and sizes."""
    from multiprocessing import shared_memory

    rng, tally = random.Random(seed), Tally()
    segment = shared_memory.SharedMemory(create=True, size=1 << 16)
    real_key = "/" + segment.name.lstrip("/")
    names = ["r0", "r1", "", "x" * 200]
    keys = [real_key, real_key, "/no_such_segment", "", "../../etc/passwd", "/dev/shm/x", "noslash"]
    try:
        with grpc.insecure_channel(target.grpc_url) as channel:
            rpc = {m: channel.unary_unary(SERVICE + m) for m in (
                "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister", "SystemSharedMemoryStatus",
                "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "ModelInfer",
            )}  # fmt: skip
            for _ in range(count):
                kind = rng.randrange(6)
                if kind == 0:
                    body = pb.SystemSharedMemoryRegisterRequest(
                        name=rng.choice(names), key=rng.choice(keys), offset=rng.choice([0, 8, 1 << 16, 1 << 62]),
                        byte_size=rng.choice([0, 64, 1 << 16, (1 << 64) - 1]),
                    ).SerializeToString()  # fmt: skip
                    method = "SystemSharedMemoryRegister"
                elif kind == 1:
                    body = pb.SystemSharedMemoryUnregisterRequest(name=rng.choice(names)).SerializeToString()
                    method = "SystemSharedMemoryUnregister"
                elif kind == 2:
                    body = pb.SystemSharedMemoryStatusRequest(name=rng.choice(names)).SerializeToString()
                    method = "SystemSharedMemoryStatus"
                elif kind == 3:
                    body = pb.CudaSharedMemoryRegisterRequest(
                        name=rng.choice(names), raw_handle=rng.randbytes(rng.choice([0, 64])),
                        device_id=rng.choice([0, -1, 7]), byte_size=rng.choice([0, 64]),
                    ).SerializeToString()  # fmt: skip
                    method = "CudaSharedMemoryRegister"
                else:
                    msg, _ = valid_request(rng)
                    del msg.raw_input_contents[:]
                    params = msg.inputs[0].parameters
                    params["shared_memory_region"].string_param = rng.choice(names)
                    params["shared_memory_byte_size"].int64_param = rng.choice([0, 64, 4096, 1 << 40])
                    params["shared_memory_offset"].int64_param = rng.choice([0, 4, 1 << 16, -8])
                    body, method = msg.SerializeToString(), "ModelInfer"
                tally.cases += 1
                try:
                    rpc[method](body, timeout=DEADLINE_S)
                    _check(tally, grpc.StatusCode.OK)
                except grpc.RpcError as e:
                    _check(tally, e.code(), e.details() or "")
            for name in names:
                with contextlib.suppress(grpc.RpcError):
                    rpc["SystemSharedMemoryUnregister"](
                        pb.SystemSharedMemoryUnregisterRequest(name=name).SerializeToString(), timeout=DEADLINE_S
                    )
    finally:
        segment.close()
        segment.unlink()
    return tally


def _http_body(rng: random.Random) -> tuple[bytes, dict[str, str], list[float] | None]:
    kind = rng.randrange(5)
    if kind == 0:
        data = [float(rng.randint(-100, 100)) for _ in range(16)]
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": data}]}
        return json.dumps(body).encode(), {"Content-Type": "application/json"}, data
    if kind == 1:
        return rng.randbytes(rng.randint(0, 300)), {}, None
    if kind == 2:
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "datatype": rng.choice(DATATYPES),
                        "shape": [1, 16],
                        "parameters": {"binary_data_size": rng.choice([0, 64, 1 << 40, -1])},
                    }
                ]
            }
        ).encode()
        length = rng.choice([len(header), 0, len(header) + 5, -3, 1 << 40])
        return header + rng.randbytes(rng.choice([0, 64, 65])), {"Inference-Header-Content-Length": str(length)}, None
    inputs = [{"name": rng.choice(NAMES), "datatype": rng.choice(DATATYPES),
               "shape": [rng.choice(DIMS) for _ in range(rng.randrange(4))],
               "data": rng.choice([[], [1, 2], "x", None, [[1.5]], {"a": 1}, [True] * 16])}
              for _ in range(rng.randrange(3))]  # fmt: skip
    body: Any = {"inputs": inputs, "id": rng.choice([1, "x", None]), "parameters": rng.choice([{}, [], "p"])}
    if rng.random() < 0.2:
        body = rng.choice([[], "s", 5, None, {"inputs": "x"}])
    return json.dumps(body).encode(), {"Content-Type": "application/json"}, None


def fuzz_http(target: Target, seed: int, count: int) -> Tally:
    """`count` POSTs to /v2/models/<m>/infer with random JSON, binary-header and garbage bodies."""
    rng, tally = random.Random(seed), Tally()
    with requests.Session() as session:
        for _ in range(count):
            body, headers, expected = _http_body(rng)
            model = "identity_fp32" if expected is not None else rng.choice(MODELS[:-1])
            tally.cases += 1
            try:
                r = session.post(
                    f"http://{target.http_url}/v2/models/{model}/infer", data=body, headers=headers, timeout=DEADLINE_S
                )
            except requests.Timeout:
                tally.hangs += 1
                continue
            except requests.ConnectionError:
                tally.statuses["connection-error"] += 1
                continue
            tally.statuses[f"http-{r.status_code}"] += 1
            tally.examples.setdefault(f"http-{r.status_code}", r.text[:300])
            if expected is not None:
                ok = r.status_code == 200 and r.json()["outputs"][0]["data"] == expected
                tally.wrong += int(not ok)
    return tally
