"""Hostile clients beyond random bytes: shared-memory regions shrunk or unlinked behind the server's back, huge
model versions, deeply nested JSON, decompression bombs and chunk floods on HTTP.

Each case must be answered with a status (any status: the tables record which) and leave the server and every
worker process alive; a worker that had to be replaced counts as a crash."""

from __future__ import annotations

import contextlib
import gzip
import os
import random
import socket
import uuid
import zlib
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import requests
from tritonclient.grpc import service_pb2 as pb

from tests.reliability.fuzz import DEADLINE_S, SERVICE, _check, valid_request
from tests.reliability.tally import Tally, Target


def _children_kept(target: Target, before: list[int]) -> bool:
    """Every worker / stub process that ran before still runs (none died and was replaced)."""
    now = set(target.children())
    return all(pid in now for pid in before)


def _grpc(target: Target, tally: Tally, method: str, body: bytes) -> None:
    with grpc.insecure_channel(target.grpc_url) as channel:
        try:
            channel.unary_unary(SERVICE + method)(body, timeout=DEADLINE_S)
            _check(tally, grpc.StatusCode.OK)
        except grpc.RpcError as e:
            _check(tally, e.code(), e.details() or "")


def _http(tally: Tally, url: str, body: bytes | Iterator[bytes], headers: dict[str, str]) -> None:
    try:
        r = requests.post(url, data=body, headers=headers, timeout=DEADLINE_S)
    except requests.Timeout:
        tally.hangs += 1
        tally.examples.setdefault("hang", f"POST {url[:120]} {headers}")
        return
    except requests.ConnectionError:
        tally.statuses["connection-error"] += 1
        return
    tally.statuses[f"http-{r.status_code}"] += 1
    tally.examples.setdefault(f"http-{r.status_code}", r.text[:300])


def _segment(size: int) -> tuple[str, str]:
    """A new POSIX segment of `size` bytes: (key, path)."""
    key = f"/reliability_{uuid.uuid4().hex[:12]}"
    path = "/dev/shm/" + key[1:]
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        os.pwrite(fd, np.ones(4096, np.float32).tobytes(), 0)
    finally:
        os.close(fd)
    return key, path


def _shm_infer(name: str, in_offset: int, out_offset: int | None, datatype: str = "FP32") -> bytes:
    """identity_fp32 (or identity_bytes) with its input (and output) in region `name`."""
    if datatype == "BYTES":
        msg = pb.ModelInferRequest(model_name="identity_bytes")
        t = msg.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 1])
        size = 8
    else:
        msg, _ = valid_request(random.Random(0))
        del msg.raw_input_contents[:]
        t = msg.inputs[0]
        size = 4 * int(np.prod(list(t.shape)))
    t.parameters["shared_memory_region"].string_param = name
    t.parameters["shared_memory_byte_size"].int64_param = size
    t.parameters["shared_memory_offset"].int64_param = in_offset
    if out_offset is not None:
        o = msg.outputs.add(name="OUTPUT0")
        o.parameters["shared_memory_region"].string_param = name
        o.parameters["shared_memory_byte_size"].int64_param = size
        o.parameters["shared_memory_offset"].int64_param = out_offset
    return msg.SerializeToString()


def _register(target: Target, tally: Tally, name: str, key: str, size: int) -> None:
    body = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=0, byte_size=size).SerializeToString()
    _grpc(target, tally, "SystemSharedMemoryRegister", body)


def _unregister(target: Target, name: str) -> None:
    body = pb.SystemSharedMemoryUnregisterRequest(name=name).SerializeToString()
    with contextlib.suppress(Exception):
        _grpc(target, Tally(), "SystemSharedMemoryUnregister", body)


def shrunk_regions(target: Target, tally: Tally, rng: random.Random) -> None:
    """Register 64 KiB, serve from it, truncate it to 4 KiB, then read and write past the new end."""
    key, path = _segment(1 << 16)
    name = f"shrunk_{rng.randrange(1 << 30)}"
    try:
        _register(target, tally, name, key, 1 << 16)
        _grpc(target, tally, "ModelInfer", _shm_infer(name, 32768, 49152))  # mapped at full size first
        os.truncate(path, 4096)
        for in_off, out_off, dt in [(32768, None, "FP32"), (0, 49152, "FP32"), (40000, None, "BYTES"),
                                    (32768, 49152, "FP32"), (0, 1024, "FP32")]:  # fmt: skip
            tally.cases += 1
            _grpc(target, tally, "ModelInfer", _shm_infer(name, in_off, out_off, dt))
    finally:
        _unregister(target, name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def unlinked_regions(target: Target, tally: Tally, rng: random.Random) -> None:
    """Register, unlink the segment, keep using the region, register its key again, unregister."""
    key, path = _segment(1 << 16)
    name = f"unlinked_{rng.randrange(1 << 30)}"
    try:
        _register(target, tally, name, key, 1 << 16)
        os.unlink(path)
        for _ in range(3):
            tally.cases += 1
            _grpc(target, tally, "ModelInfer", _shm_infer(name, 0, 8192))
        tally.cases += 1
        _register(target, tally, name + "_again", key, 1 << 16)  # the key is gone: a clean error
    finally:
        _unregister(target, name)
        _unregister(target, name + "_again")


def huge_versions(target: Target, tally: Tally, rng: random.Random) -> None:
    """Model versions of thousands of digits, over gRPC (ModelInfer, ModelReady, ModelMetadata) and HTTP."""
    for digits in (100, 4301, 10_000, 100_000):
        version = "".join(rng.choice("0123456789") for _ in range(digits))
        msg, _ = valid_request(rng)
        msg.model_version = version
        tally.cases += 3
        _grpc(target, tally, "ModelInfer", msg.SerializeToString())
        _grpc(
            target, tally, "ModelReady", pb.ModelReadyRequest(name="identity_fp32", version=version).SerializeToString()
        )
        meta = pb.ModelMetadataRequest(name="identity_fp32", version=version)
        _grpc(target, tally, "ModelMetadata", meta.SerializeToString())
        if target.http_url:
            tally.cases += 1
            url = f"http://{target.http_url}/v2/models/identity_fp32/versions/{version}/infer"
            _http(tally, url, b'{"inputs": []}', {"Content-Type": "application/json"})


def deep_json(target: Target, tally: Tally, rng: random.Random) -> None:
    """Infer bodies nested 100 to 1,000,000 deep (arrays and objects), in data, parameters and the top level."""
    url = f"http://{target.http_url}/v2/models/identity_fp32/infer"
    for depth in (100, 10_000, 100_000, 1_000_000):
        nested_list = "[" * depth + "1" + "]" * depth
        nested_obj = '{"a":' * depth + "1" + "}" * depth
        bodies = [
            '{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":' + nested_list + "}]}",
            '{"inputs":[],"parameters":' + nested_obj + "}",
            nested_list,
        ]
        for body in bodies:
            tally.cases += 1
            _http(tally, url, body.encode(), {"Content-Type": "application/json"})


def decompression_bombs(target: Target, tally: Tally, rng: random.Random) -> None:
    """Small compressed bodies that inflate to 1 GiB of JSON-ish bytes (gzip and deflate)."""
    url = f"http://{target.http_url}/v2/models/identity_fp32/infer"
    chunk = b" " * (1 << 20)
    gz = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip container
    df = zlib.compressobj(9, zlib.DEFLATED, 15)  # zlib container ("deflate")
    gz_body = b"".join(gz.compress(chunk) for _ in range(1024)) + gz.flush()
    df_body = b"".join(df.compress(chunk) for _ in range(1024)) + df.flush()
    valid = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":[' + b",".join([b"1"] * 16) + b"]}]}"
    small = gzip.compress(valid)  # a real request, compressed: answered 200
    for encoding, body in (("gzip", gz_body), ("deflate", df_body), ("gzip", small), ("br", gz_body)):
        tally.cases += 1
        _http(tally, url, body, {"Content-Type": "application/json", "Content-Encoding": encoding})


def _raw_http(
    target: Target,
    tally: Tally,
    head: bytes,
    body_parts: Callable[[socket.socket], None],
    timeout_s: float = DEADLINE_S,
) -> None:
    host, port = target.http_url.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
            s.sendall(head)
            with contextlib.suppress(OSError):  # the server may close early: its answer (if any) is read below
                body_parts(s)
            status = s.recv(64).split(b" ")[1:2]
            tally.statuses[f"http-{(status[0] if status else b'closed').decode()}"] += 1
    except TimeoutError:
        tally.hangs += 1
        tally.examples.setdefault("hang", f"chunked POST: {body_parts.__name__}")
    except OSError:
        tally.statuses["connection-error"] += 1


def chunk_floods(target: Target, tally: Tally, rng: random.Random) -> None:
    """Chunked bodies of 200,000 one-byte chunks, of one endless chunk header, and of chunk extensions."""
    head = (
        f"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: {target.http_url}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()

    def tiny_chunks(s: socket.socket) -> None:
        block = b"1\r\n \r\n" * 10_000
        for _ in range(20):
            s.sendall(block)
        s.sendall(b"0\r\n\r\n")

    def endless_size_line(s: socket.socket) -> None:
        s.sendall(b"f" * (1 << 20))  # a chunk-size line that never ends

    def extensions(s: socket.socket) -> None:  # malformed (a trailing ';'), small enough to arrive in one read
        s.sendall(b"1;" + b"x=y;" * 1000 + b"\r\n \r\n0\r\n\r\n")

    for parts in (tiny_chunks, endless_size_line, extensions):
        tally.cases += 1
        _raw_http(target, tally, head, parts)


GROUPS = [shrunk_regions, unlinked_regions, huge_versions, deep_json, decompression_bombs, chunk_floods]
HTTP_GROUPS = {deep_json, decompression_bombs, chunk_floods}


def split_malformed_chunk(target: Target, tally: Tally, rng: random.Random) -> None:
    """A malformed chunk extension of 200 KB: it arrives in several reads, after the request's handler started."""
    head = (
        f"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: {target.http_url}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()

    def extensions(s: socket.socket) -> None:
        s.sendall(b"1;" + b"x=y;" * 50_000 + b"\r\n \r\n0\r\n\r\n")

    tally.cases += 1
    _raw_http(target, tally, head, extensions, timeout_s=5.0)  # a server that answers does so at once


def fuzz_hostile(target: Target, seed: int, rounds: int = 1, only: list[str] | None = None) -> Tally:
    """Every hostile case (or the groups named in `only`) `rounds` times; crashes: the server stopped answering,
    or a worker was replaced. The run stops at a crash (Triton 2.51 dies on a shrunk region)."""
    rng, tally = random.Random(seed), Tally()
    before = target.children()
    groups = [g for g in GROUPS if (only is None or g.__name__ in only) and (target.http_url or g not in HTTP_GROUPS)]
    for _ in range(rounds):
        for group in groups:
            group(target, tally, rng)
            if not target.alive():
                tally.crashes += 1
                tally.examples.setdefault("crash", f"server gone after {group.__name__}")
                return tally
            if not _children_kept(target, before):
                tally.crashes += 1
                tally.examples.setdefault("crash", f"a worker died in {group.__name__}")
                before = target.children()
    return tally
