"""Hostile HTTP/2 on the gRPC port: no byte sequence may crash the server or stop it serving.

On the h2 transport Trireme parses every HTTP/2 frame and HPACK block itself (docs/grpc.md), so the gRPC port
gets what the HTTP port has had since the start: seeded random connections built from a valid request and then
broken (bytes flipped, cut short, frames of every type with random flags, stream ids and lengths, bad SETTINGS,
zero or overflowing WINDOW_UPDATEs, CONTINUATION out of place, garbage HPACK). After them the server process and
its worker are alive, tritonclient gets correct answers, and on h2 every case was handled as a protocol error
(the server's log holds no traceback and no use of the connection's safety net for internal errors). grpcio
runs the same connections as the reference."""

from __future__ import annotations

import os
import random
import socket
import struct

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess
from tests.integration.test_grpc_h2_wire import PREFACE, frame

hpack = pytest.importorskip("hpack", reason="hpack is not installed (trireme[grpc-h2])")

CONNECTIONS = 400
SEED = int(os.environ.get("TRIREME_FUZZ_SEED", "20261127"))  # another seed explores other cases locally


def _valid_request(rng: random.Random) -> bytes:
    """Preface, SETTINGS and one ServerLive call: the starting point every case breaks."""
    headers = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ServerLive")]
    headers += [(":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")]
    sid = rng.choice((1, 3, 5))
    block = hpack.Encoder().encode(headers)
    return PREFACE + frame(4, 0, 0) + frame(1, 0x4, sid, block) + frame(0, 0x1, sid, struct.pack(">BI", 0, 0))


def _random_frame(rng: random.Random) -> bytes:
    ftype = rng.choice((*range(10), rng.randrange(256)))
    flags = rng.randrange(256)
    sid = rng.choice((0, 1, 2, 3, 0x7FFFFFFF, rng.randrange(1 << 31)))
    size = rng.choice((0, 1, 4, 5, 6, 8, 9, rng.randrange(64), rng.randrange(20000)))
    payload = rng.randbytes(size)
    if ftype == 4 and rng.random() < 0.7:  # SETTINGS with known ids and edge values
        payload = b"".join(
            struct.pack(">HI", rng.randrange(1, 8), rng.choice((0, 1, 16383, 16384, 1 << 24, 0x7FFFFFFF, 0xFFFFFFFF)))
            for _ in range(rng.randrange(1, 4))
        )
    if ftype == 8 and rng.random() < 0.7:  # WINDOW_UPDATE: zero or overflowing increments
        payload = struct.pack(">I", rng.choice((0, 1, 0x7FFFFFFF, 0xFFFFFFFF)))
    out = frame(ftype, flags, sid, payload)
    if rng.random() < 0.05:  # a length that lies
        out = struct.pack(">I", rng.randrange(1 << 24))[1:] + out[3:]
    return out


def _case(rng: random.Random) -> bytes:
    base = bytearray(_valid_request(rng))
    kind = rng.randrange(5)
    if kind == 0:  # flip bytes of a valid exchange (the preface included)
        for _ in range(rng.randrange(1, 8)):
            base[rng.randrange(len(base))] = rng.randrange(256)
        return bytes(base)
    if kind == 1:  # cut short
        return bytes(base[: rng.randrange(len(base))])
    if kind == 2:  # a valid start, then random frames
        return PREFACE + frame(4, 0, 0) + b"".join(_random_frame(rng) for _ in range(rng.randrange(1, 12)))
    if kind == 3:  # HEADERS whose HPACK block is garbage, or CONTINUATION where none may come
        sid = rng.choice((1, 3))
        bad = frame(1, rng.choice((0, 0x4, 0x5)), sid, rng.randbytes(rng.randrange(1, 200)))
        if rng.random() < 0.5:
            bad += frame(9, 0x4, sid, rng.randbytes(rng.randrange(1, 50)))
        return PREFACE + frame(4, 0, 0) + bad
    return bytes(rng.randbytes(rng.randrange(1, 300)))  # no preface at all


def _send(port: int, data: bytes, rng: random.Random) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            for i in range(0, len(data), max(1, rng.choice((1, 7, 64, len(data))))):
                s.sendall(data[i : i + max(1, rng.choice((1, 7, 64, len(data))))])
            s.settimeout(0.05)
            while s.recv(65536):  # read what the server answers until it closes or pauses
                pass
        except OSError:  # the server may reset a hostile connection: that is an answer, not a failure
            pass


def test_hostile_http2_leaves_the_server_serving(transport_server: ServerProcess) -> None:
    server = transport_server
    rng = random.Random(SEED)
    for _ in range(CONNECTIONS):
        _send(server.port, _case(rng), rng)
    assert server.proc.poll() is None, server.log()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        assert client.is_server_live()
        x = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(x)
        result = client.infer("add_sub_int32", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + x)
    finally:
        client.close()
    if server.transport == "h2":  # type: ignore[attr-defined]
        log = server.log()
        # the connection's safety net ("closed after an internal error") must not be what handled them either
        for sign in ("Traceback", "Fatal error", "internal error"):
            assert sign not in log, log[-4000:]
