"""Reliability probes beyond fuzzing: a worker killed under load, SIGTERM drain, a soak with RSS tracking, idle and
abruptly reset connections, unread streams, 100 MiB messages. Each returns a Tally."""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import requests
from tritonclient.grpc import service_pb2 as pb

from tests.reliability.fuzz import DEADLINE_S, SERVICE, valid_request
from tests.reliability.tally import Tally, Target

BIG = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)]


def _slow_request(model: str, value: float) -> bytes:
    msg = pb.ModelInferRequest(model_name=model)
    msg.inputs.add(name="IN", datatype="FP32", shape=[1, 1])
    msg.raw_input_contents.append(np.float32(value).tobytes())
    return msg.SerializeToString()


def _slow_reply(raw: bytes) -> tuple[float, int]:
    reply = pb.ModelInferResponse.FromString(raw)
    outs = {o.name: i for i, o in enumerate(reply.outputs)}
    value = float(np.frombuffer(reply.raw_output_contents[outs["OUT"]], np.float32)[0])
    pid = int(np.frombuffer(reply.raw_output_contents[outs["PID"]], np.int64)[0])
    return value, pid


def kill_under_load(target: Target, seconds: float, threads: int = 4) -> tuple[Tally, float]:
    """Load on `slow`; after a third of the time its serving process is killed (SIGKILL). Every request must be
    answered exactly once (an error is allowed only while the worker is down). Returns the tally and the seconds
    until `slow` served again (-1: never, within the probe)."""
    tally = Tally()
    victim: list[int] = []
    kill_at = time.monotonic() + seconds / 3
    end = time.monotonic() + seconds
    killed_at: list[float] = []
    recovered: list[float] = []
    seen: set[int] = set()  # processes that served `slow` before the kill
    lock = threading.Lock()

    def client(n: int) -> None:
        with grpc.insecure_channel(target.grpc_url) as channel:
            infer = channel.unary_unary(SERVICE + "ModelInfer")
            i = 0
            while time.monotonic() < end:
                i += 1
                value = float(n * 1_000_000 + i)
                with lock:
                    tally.cases += 1
                try:
                    got, pid = _slow_reply(infer(_slow_request("slow", value), timeout=DEADLINE_S))
                except grpc.RpcError as e:
                    with lock:
                        tally.statuses[e.code().name] += 1
                        tally.hangs += int(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED)
                    continue
                with lock:
                    tally.statuses["OK"] += 1
                    tally.wrong += int(got != value + 1)
                    if not victim:
                        seen.add(pid)
                        if time.monotonic() >= kill_at:
                            victim.append(pid)
                            os.kill(pid, signal.SIGKILL)
                            killed_at.append(time.monotonic())
                    elif not recovered and pid not in seen:  # a process started after the kill served it
                        recovered.append(time.monotonic())

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(client, range(threads)))
    tally.crashes += int(not target.alive())
    return tally, (recovered[0] - killed_at[0]) if recovered and killed_at else -1.0


def drain_on_sigterm(start: Callable[[], Target], requests_in_flight: int = 8) -> tuple[Tally, int]:
    """Requests in flight on `sleepy` (1 s per batch) when SIGTERM arrives: all must complete; the server must exit.
    Returns the tally and the exit status."""
    target = start()
    tally = Tally(cases=requests_in_flight)
    results: list[Any] = [None] * requests_in_flight

    def one(i: int) -> None:
        with grpc.insecure_channel(target.grpc_url) as channel:
            try:
                value, _ = _slow_reply(
                    channel.unary_unary(SERVICE + "ModelInfer")(_slow_request("sleepy", i), timeout=30)
                )
                results[i] = value == i + 1
            except grpc.RpcError as e:
                results[i] = e.code().name

    workers = [threading.Thread(target=one, args=(i,)) for i in range(requests_in_flight)]
    for w in workers:
        w.start()
    time.sleep(0.4)  # the requests are queued / running (nothing to await across processes)
    target.proc.send_signal(signal.SIGTERM)
    for w in workers:
        w.join(60)
    try:
        status = target.proc.wait(60)
    except Exception:
        target.proc.kill()
        status = target.proc.wait()
        tally.hangs += 1
    if target.log_file is not None:
        target.log_file.close()
    for r in results:
        tally.statuses[str(r)] += 1
        tally.lost += int(r is None or isinstance(r, str))
        tally.wrong += int(r is False)
    return tally, status


def soak(target: Target, seconds: float, threads: int = 3) -> Tally:
    """Mixed valid load (unary, stream, HTTP) for `seconds`; RSS growth from after the first fifth to the end."""
    tally = Tally()
    end = time.monotonic() + seconds
    lock = threading.Lock()
    baseline: list[int] = []

    def unary_and_stream(n: int) -> None:
        import random

        rng = random.Random(n)
        with grpc.insecure_channel(target.grpc_url) as channel:
            infer = channel.unary_unary(SERVICE + "ModelInfer")
            stream = channel.stream_stream(SERVICE + "ModelStreamInfer")
            while time.monotonic() < end:
                batch = [valid_request(rng) for _ in range(8)]
                ok = 0
                try:
                    replies = [pb.ModelInferResponse.FromString(infer(batch[0][0].SerializeToString(), timeout=20))]
                    replies += [
                        pb.ModelStreamInferResponse.FromString(r).infer_response
                        for r in stream(iter([m.SerializeToString() for m, _ in batch[1:]]), timeout=20)
                    ]
                    for reply, (_, data) in zip(replies, batch, strict=True):
                        got = np.frombuffer(reply.raw_output_contents[0], np.float32).reshape(data.shape)
                        ok += int(np.array_equal(got, data))
                except (grpc.RpcError, ValueError, IndexError):
                    pass
                with lock:
                    tally.cases += len(batch)
                    tally.wrong += len(batch) - ok
                    if not baseline and time.monotonic() > end - seconds * 0.8:
                        baseline.append(target.rss_bytes())

    def http() -> None:
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": list(range(16))}]}
        with requests.Session() as session:
            while time.monotonic() < end:
                r = session.post(f"http://{target.http_url}/v2/models/identity_fp32/infer", json=body, timeout=20)
                with lock:
                    tally.cases += 1
                    tally.wrong += int(r.status_code != 200 or r.json()["outputs"][0]["data"] != list(range(16)))

    jobs = [threading.Thread(target=unary_and_stream, args=(n,)) for n in range(threads)]
    if target.http_url:
        jobs.append(threading.Thread(target=http))
    for j in jobs:
        j.start()
    for j in jobs:
        j.join()
    tally.rss_growth = target.rss_bytes() - (baseline[0] if baseline else target.rss_bytes())
    tally.crashes += int(not target.alive())
    return tally


def idle_connections(target: Target, count: int) -> Tally:
    """`count` idle, half-sent and slowloris connections on both ports held open while valid requests are served,
    then reset abruptly (RST) or closed; the server must serve throughout and afterwards."""
    tally = Tally()
    socks = []
    payloads = [b"", b"PRI * HTTP/2.0\r\n", b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nContent-Length: 999"]
    ports = [int(u.rsplit(":", 1)[1]) for u in (target.grpc_url, target.http_url) if u]
    for i in range(count):
        s = socket.create_connection(("127.0.0.1", ports[i % len(ports)]), timeout=5)
        s.sendall(payloads[i % len(payloads)])
        socks.append(s)
    tally.cases += count
    tally.add(_valid_round(target, 20))
    for i, s in enumerate(socks):
        if i % 2:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, as a vanished peer
        s.close()
    tally.add(_valid_round(target, 20))
    tally.crashes += int(not target.alive())
    return tally


def _valid_round(target: Target, count: int) -> Tally:
    import random

    tally = Tally(cases=count)
    rng = random.Random(count)
    with grpc.insecure_channel(target.grpc_url) as channel:
        infer = channel.unary_unary(SERVICE + "ModelInfer")
        for _ in range(count):
            msg, data = valid_request(rng)
            try:
                reply = pb.ModelInferResponse.FromString(infer(msg.SerializeToString(), timeout=DEADLINE_S))
                got = np.frombuffer(reply.raw_output_contents[0], np.float32).reshape(data.shape)
                tally.wrong += int(not np.array_equal(got, data))
            except grpc.RpcError as e:
                tally.hangs += int(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED)
                tally.wrong += 1
    return tally


def _big_requests(count: int, elements: int, stop: threading.Event) -> Iterator[bytes]:
    for i in range(count):
        if stop.is_set():
            return
        msg = pb.ModelInferRequest(model_name="identity_fp32_any", id=str(i))
        msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
        msg.raw_input_contents.append(np.full(elements, i, np.float32).tobytes())
        yield msg.SerializeToString()


def _executed(target: Target, model: str) -> int:
    with grpc.insecure_channel(target.grpc_url) as channel:
        stats = channel.unary_unary(SERVICE + "ModelStatistics")
        raw = stats(pb.ModelStatisticsRequest(name=model).SerializeToString(), timeout=DEADLINE_S)
    return int(pb.ModelStatisticsResponse.FromString(raw).model_stats[0].inference_count)


def _quiesce(target: Target, model: str, quiet_s: float = 1.0, limit_s: float = 30.0) -> None:
    """Wait until `model` stopped executing requests for quiet_s (what a cancelled stream left has finished)."""
    last, since = -1, time.monotonic()
    deadline = since + limit_s
    while time.monotonic() < deadline:
        now = _executed(target, model)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.1)


def unread_streams(target: Target, cycles: int, streams: int = 4, mib_each: int = 40, hold_s: float = 3.0) -> Tally:
    """Streams that send `mib_each` MiB of requests and never read, cancelled after a while, `cycles` times; RSS
    growth: the lowest RSS after a later cycle minus the RSS after the first. Then a valid round."""
    tally = Tally()
    rss: list[int] = []
    with grpc.insecure_channel(target.grpc_url, options=BIG) as channel:
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer")
        for _ in range(cycles):
            stop = threading.Event()
            calls = [stream(_big_requests(mib_each * 4, 64 * 1024, stop)) for _ in range(streams)]
            time.sleep(hold_s)  # the server reads until its per-stream buffer is full (nothing to await: no reader)
            stop.set()
            for call in calls:
                call.cancel()
            tally.cases += streams
            _quiesce(target, "identity_fp32_any")
            rss.append(target.rss_bytes())
    # a leak raises every later cycle; the allocator's ups and downs (tens of MiB) do not raise the lowest one
    tally.rss_growth = max(0, min(rss[1:]) - rss[0]) if len(rss) > 1 else 0
    tally.add(_valid_round(target, 10))
    tally.crashes += int(not target.alive())
    return tally


def big_messages(target: Target, mib: int = 100) -> Tally:
    """One `mib` MiB tensor through ModelInfer and ModelStreamInfer (echoed back and compared), and as an HTTP body
    (answered cleanly: 200 with the data, or a 4xx error)."""
    tally = Tally()
    elements = mib * 2**20 // 4
    data = np.arange(elements, dtype=np.float32)
    msg = pb.ModelInferRequest(model_name="identity_fp32_any", id="big")
    msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    msg.raw_input_contents.append(data.tobytes())
    body = msg.SerializeToString()
    with grpc.insecure_channel(target.grpc_url, options=BIG) as channel:
        for name in ("unary", "stream"):
            tally.cases += 1
            try:
                if name == "unary":
                    raw = pb.ModelInferResponse.FromString(
                        channel.unary_unary(SERVICE + "ModelInfer")(body, timeout=120)
                    )
                else:
                    replies = list(channel.stream_stream(SERVICE + "ModelStreamInfer")(iter([body]), timeout=120))
                    raw = pb.ModelStreamInferResponse.FromString(replies[0]).infer_response
                tally.statuses[f"{name}-OK"] += 1
                tally.wrong += int(not np.array_equal(np.frombuffer(raw.raw_output_contents[0], np.float32), data))
            except grpc.RpcError as e:
                tally.statuses[f"{name}-{e.code().name}"] += 1
                tally.wrong += 1
    if target.http_url:
        tally.cases += 1
        header = (
            b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,%d],"parameters":{"binary_data_size":%d}}]}'
            % (elements, elements * 4)
        )
        r = requests.post(
            f"http://{target.http_url}/v2/models/identity_fp32_any/infer",
            data=header + data.tobytes(),
            headers={"Inference-Header-Content-Length": str(len(header))},
            timeout=120,
        )
        tally.statuses[f"http-{r.status_code}"] += 1
        tally.wrong += int(r.status_code >= 500)
    tally.crashes += int(not target.alive())
    return tally
