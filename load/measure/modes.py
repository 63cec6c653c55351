"""Load schedules: closed-loop concurrency and open-loop request rate, unary or streaming, with sequences.

`LocalEngine` runs the load inside this process. Hot paths are kept lean (pre-serialized requests,
identity serializers, one list append per request): a blocking thread per concurrency slot for sync
unary/stream calls (the fastest Python option measured here), and gRPC future callbacks or one shared
stream for `--async` and request-rate loads. Every completed request is recorded as
`(start_ns, end_ns, flags)` on the system-wide monotonic clock, so records from worker processes mix.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from load.transports.client import InferenceClient, request_suffix
from load.transports.streams import (
    AsyncTransport,
    H2Transport,
    SharedStream,
    UnaryFutures,
    is_final,
    parse_stream,
    parse_unary,
    rpc_message,
)

FLAG_SEQUENCE_END = 1
FLAG_DELAYED = 2
RESPONSES_SHIFT = 2  # flags >> RESPONSES_SHIFT = number of responses (decoupled streaming)
DELAY_TOLERANCE_NS = 1_000_000  # a request-rate send later than this behind schedule counts as delayed

now_ns = time.monotonic_ns


@dataclass(frozen=True)
class SequenceSpec:
    """Sequence settings: lengths vary uniformly by ±variation %, ids cycle through [id_start, id_end]."""

    length: int = 20
    variation: float = 20.0
    id_start: int = 1
    id_end: int = 2**32 - 1
    num_sequences: int = 4  # concurrently active sequences in request-rate mode
    use_stream_lengths: bool = False  # JSON data: a sequence is exactly one data stream


@dataclass(frozen=True)
class LoadSpec:
    """How load is generated; `process_index/count` split levels and sequence ids across processes."""

    mode: str = "concurrency"  # or "request_rate"
    transport: str = "h2"  # unary calls over load/transports/h2.py, or "grpc" (the grpc library)
    streaming: bool = False
    use_async: bool = False
    max_threads: int = 16
    distribution: str = "constant"  # or "poisson"
    sequence: SequenceSpec | None = None
    decoupled: bool = False
    seed: int = 0
    process_index: int = 0
    process_count: int = 1


@dataclass
class Collected:
    """Requests completed since the previous take, plus cumulative client-library counters."""

    records: np.ndarray  # int64 (n, 3): start_ns, end_ns, flags
    send_ns: int = 0
    recv_ns: int = 0
    completed: int = 0
    sent: int = 0
    cpu_ns: int = 0  # CPU time of the load process(es): threads, gRPC and all
    error: str | None = None


@dataclass
class _Counters:
    send_ns: int = 0
    recv_ns: int = 0
    completed: int = 0


@dataclass
class _SeqState:
    seq_id: int = 0
    remaining: int = 0
    stream: int = 0
    step: int = 0
    suffixes: tuple[bytes, bytes, bytes] = (b"", b"", b"")  # start, middle, end
    single: bytes = b""  # start+end, for one-request sequences


@dataclass
class _Source:
    """Yields the next request body and its flags for one slot (cycling data, driving sequences)."""

    engine: LocalEngine
    offset: int
    seq: _SeqState | None = None
    counter: Any = field(default_factory=itertools.count)

    def next(self) -> tuple[bytes, int]:
        eng = self.engine
        if self.seq is None:
            flat = eng.flat
            return flat[(self.offset + next(self.counter)) % len(flat)], 0
        st = self.seq
        if st.remaining <= 0:
            eng.start_sequence(st)
        steps = eng.streams[st.stream]
        body = steps[st.step % len(steps)]
        first = st.step == 0
        st.step += 1
        st.remaining -= 1
        if st.remaining == 0:
            return body + (st.single if first else st.suffixes[2]), FLAG_SEQUENCE_END
        return body + (st.suffixes[0] if first else st.suffixes[1]), 0


class LocalEngine:
    """Drives one load level at a time inside this process; `take()` drains completed records."""

    def __init__(self, client: InferenceClient, streams: Sequence[Sequence[bytes]], spec: LoadSpec) -> None:
        self.client = client
        self.use_h2 = spec.transport == "h2" and not spec.streaming
        self.streams = [list(s) for s in streams]
        self.flat = [b for s in self.streams for b in s]
        self.spec = spec
        self._infer = client.raw_infer()
        self._stream_call = client.raw_stream()
        self._records: list[tuple[int, int, int]] = []
        self._counters: list[_Counters] = []
        self._sent = 0
        self._error: str | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._inflight = 0
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._transport: AsyncTransport | None = None
        self._seq_ids = itertools.count()
        self._seq_streams = itertools.count(spec.process_index)
        self._rng = np.random.default_rng(spec.seed + 7919 * spec.process_index)

    # ---- sequences -------------------------------------------------------------------------------------
    def start_sequence(self, st: _SeqState) -> None:
        """Begin the next sequence in `st`: new id, data stream and length."""
        seq = self.spec.sequence
        assert seq is not None
        span = seq.id_end - seq.id_start + 1
        k = next(self._seq_ids) * self.spec.process_count + self.spec.process_index
        st.seq_id = seq.id_start + k % span
        st.stream = next(self._seq_streams) % len(self.streams)
        st.step = 0
        if seq.use_stream_lengths:
            st.remaining = len(self.streams[st.stream])
        else:
            spread = seq.length * seq.variation / 100.0
            st.remaining = max(1, round(seq.length + self._rng.uniform(-spread, spread)))
        st.suffixes = (
            request_suffix(sequence_id=st.seq_id, sequence_start=True),
            request_suffix(sequence_id=st.seq_id),
            request_suffix(sequence_id=st.seq_id, sequence_end=True),
        )
        st.single = request_suffix(sequence_id=st.seq_id, sequence_start=True, sequence_end=True)

    def _source(self, offset: int) -> _Source:
        return _Source(self, offset, _SeqState() if self.spec.sequence else None)

    # ---- control ---------------------------------------------------------------------------------------
    def set_level(self, level: float) -> None:
        """Stop the current load and start `level` (concurrency slots, or requests per second)."""
        self.stop_load()
        self._stop = threading.Event()
        with self._lock:  # requests abandoned by a stop that timed out no longer count
            self._inflight = 0
            self._idle.set()
        if self.spec.mode == "concurrency":
            self._start_concurrency(int(level))
        else:
            self._start_rate(float(level))

    def error(self) -> str | None:
        """The first request failure, if any (the load stops at the first failure)."""
        return self._error

    def take(self) -> Collected:
        """Records completed since the last call (safe while the load runs) and cumulative counters."""
        recs = self._records
        n = len(recs)
        chunk = recs[:n]
        del recs[:n]
        arr = np.array(chunk, dtype=np.int64).reshape(-1, 3)
        out = Collected(arr, sent=self._sent, cpu_ns=time.process_time_ns(), error=self._error)
        for c in self._counters:
            out.send_ns += c.send_ns
            out.recv_ns += c.recv_ns
            out.completed += c.completed
        return out

    def stop_load(self, timeout_s: float = 10.0) -> None:
        """Stop issuing requests and wait (bounded) for in-flight ones to finish."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._idle.wait(max(0.0, deadline - time.monotonic()))
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._threads = []

    def close(self) -> None:
        """Stop the load; the client stays open (its owner closes it)."""
        self.stop_load()

    def _fail(self, message: str) -> None:
        if self._error is None:
            self._error = message
        self._stop.set()

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name=f"load-{len(self._threads)}")
        self._threads.append(t)
        t.start()

    # ---- concurrency -----------------------------------------------------------------------------------
    def _start_concurrency(self, slots: int) -> None:
        if slots <= 0:
            return
        if not self.use_h2 and not self.spec.use_async and slots <= self.spec.max_threads:
            target = self._stream_slot if self.spec.streaming else self._unary_slot
            for i in range(slots):
                self._spawn(target, self._source(i), self._new_counters())
            return
        self._transport = self._make_transport()
        for i in range(slots):
            self._begin()
            self._issue_closed(self._source(i), self._new_counters())

    def _new_counters(self) -> _Counters:
        c = _Counters()
        self._counters.append(c)
        return c

    def _unary_slot(self, source: _Source, ctr: _Counters) -> None:
        call, record, stop, parse = self._infer, self._records.append, self._stop, parse_unary
        while not stop.is_set():
            t0 = now_ns()
            body, flags = source.next()
            t1 = now_ns()
            try:
                resp = call(body)
            except grpc.RpcError as err:
                self._fail(rpc_message(err))
                return
            t2 = now_ns()
            parse(resp)
            t3 = now_ns()
            ctr.send_ns += t1 - t0
            ctr.recv_ns += t3 - t2
            ctr.completed += 1
            record((t0, t3, flags | 1 << RESPONSES_SHIFT))

    def _stream_slot(self, source: _Source, ctr: _Counters) -> None:
        requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        responses: Any = self._stream_call(iter(requests.get, None))
        record, stop, decoupled = self._records.append, self._stop, self.spec.decoupled
        try:
            while not stop.is_set():
                t0 = now_ns()
                body, flags = source.next()
                t1 = now_ns()
                requests.put(body)
                count, last, recv = 0, 0, 0
                while True:
                    raw = next(responses)
                    t2 = now_ns()
                    msg = parse_stream(raw)
                    t3 = now_ns()
                    recv += t3 - t2
                    if msg.error_message:
                        self._fail(msg.error_message)
                        return
                    final = not decoupled or is_final(msg)
                    if msg.infer_response.outputs or not final or count == 0:
                        count, last = count + 1, t3
                    if final:
                        break
                ctr.send_ns += t1 - t0
                ctr.recv_ns += recv
                ctr.completed += 1
                record((t0, last, flags | count << RESPONSES_SHIFT))
        except grpc.RpcError as err:
            self._fail(rpc_message(err))
        except StopIteration:
            self._fail("the server closed the inference stream")
        finally:
            requests.put(None)
            responses.cancel()

    def _begin(self) -> None:
        with self._lock:
            self._inflight += 1
            self._idle.clear()

    def _end(self) -> None:
        with self._lock:
            self._inflight = max(0, self._inflight - 1)
            if self._inflight == 0:
                self._idle.set()

    def _issue_closed(self, source: _Source, ctr: _Counters) -> None:
        """Send the next request of a closed-loop slot; its completion sends the following one."""
        if self._stop.is_set():
            self._end()
            return
        t0 = now_ns()
        body, flags = source.next()
        t1 = now_ns()

        def done(t_end: int, err: str | None, responses: int, recv_ns: int) -> None:
            if err is not None:
                self._fail(err)
                self._end()
                return
            ctr.send_ns += t1 - t0
            ctr.recv_ns += recv_ns
            ctr.completed += 1
            self._records.append((t0, t_end, flags | responses << RESPONSES_SHIFT))
            self._issue_closed(source, ctr)

        assert self._transport is not None
        self._transport.submit(body, done)

    # ---- request rate ----------------------------------------------------------------------------------
    def _start_rate(self, rate: float) -> None:
        if rate <= 0:
            return
        self._transport = self._make_transport()
        self._spawn(self._schedule, rate)

    def _schedule(self, rate: float) -> None:
        """Open loop: send at constant or Poisson intervals regardless of completions."""
        spec, stop = self.spec, self._stop
        interval_ns = 1e9 / rate
        sources = [self._source(i) for i in range(spec.sequence.num_sequences if spec.sequence else 1)]
        ctr = self._new_counters()
        transport = self._transport
        assert transport is not None
        next_t = float(now_ns()) + interval_ns * spec.process_index / max(1, spec.process_count)
        rng = self._rng
        for i in itertools.count():
            if stop.is_set():
                return
            next_t += rng.exponential(interval_ns) if spec.distribution == "poisson" else interval_ns
            wait = (next_t - now_ns()) / 1e9
            if wait > 0 and stop.wait(wait):
                return
            t0 = now_ns()
            delayed = FLAG_DELAYED if t0 - next_t > DELAY_TOLERANCE_NS else 0
            body, flags = sources[i % len(sources)].next()
            t1 = now_ns()
            self._sent += 1
            self._begin()
            transport.submit(body, self._rate_done(ctr, t0, t1, flags | delayed))

    def _rate_done(self, ctr: _Counters, t0: int, t1: int, flags: int) -> Callable[[int, str | None, int, int], None]:
        def done(t_end: int, err: str | None, responses: int, recv_ns: int) -> None:
            if err is not None:
                self._fail(err)
            else:
                ctr.send_ns += t1 - t0
                ctr.recv_ns += recv_ns
                ctr.completed += 1
                self._records.append((t0, t_end, flags | responses << RESPONSES_SHIFT))
            self._end()

        return done

    def _make_transport(self) -> AsyncTransport:
        if self.spec.streaming:
            return SharedStream(self._stream_call, self.spec.decoupled, self._fail)
        if self.use_h2:
            return H2Transport(self.client.url, self._infer)
        return UnaryFutures(self._infer)
