"""One server under load: connect, check the model, prepare payloads and shared memory, build the engine.

A `Session` owns everything that must be released afterwards (channel, worker processes, shared-memory
regions and their registrations), so the CLI and compare mode just use it as a context manager.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from types import TracebackType
from typing import Any, TextIO

from load.measure.data import (
    ConfigError,
    ModelInfo,
    check_batch_size,
    fetch_model_info,
    json_steps,
    parse_shape_options,
    resolve_dims,
    synthetic_steps,
)
from load.measure.modes import LoadSpec, LocalEngine, SequenceSpec
from load.measure.payload import Payloads, build_payloads
from load.measure.profiler import Measurement, Profiler, Progress, ServerStats
from load.measure.workers import ProcessEngine
from load.transports.client import ClientError, InferenceClient


def levels_of(rng: tuple[Any, Any, Any]) -> list[float]:
    """start, start+step, ... up to end (inclusive, with float tolerance)."""
    start, end, step = rng
    out, i = [], 0
    while start + i * step <= end + 1e-9 and i < 10_000:
        out.append(start + i * step)
        i += 1
    return out


def connect(url: str, timeout_s: float) -> InferenceClient:
    """A client for `url` whose server answered ServerLive; ConfigError-free, ClientError if down."""
    client = InferenceClient(url, timeout_s)
    try:
        if not client.server_live():
            raise ClientError("UNAVAILABLE", f"server at {url} reports it is not live")
    except ClientError as err:
        client.close()
        if err.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            raise ClientError(err.code, f"cannot reach a server at {url} ({err.message})") from None
        raise
    return client


def sequence_spec(args: argparse.Namespace, info: ModelInfo, streams: int, from_file: bool) -> SequenceSpec | None:
    """Sequence settings for a sequence model (None for other models)."""
    if not info.is_sequence:
        return None
    start_s, _, end_s = str(args.sequence_id_range).partition(":")
    try:
        start = int(start_s)
        end = int(end_s) - 1 if end_s else 2**32 - 1
    except ValueError:
        raise ConfigError(f"--sequence-id-range '{args.sequence_id_range}' is not start[:end]") from None
    if start < 1 or end < start:
        raise ConfigError("--sequence-id-range needs 1 <= start < end")
    return SequenceSpec(
        length=args.sequence_length or 20,
        variation=args.sequence_length_variation,
        id_start=start,
        id_end=end,
        num_sequences=args.num_of_sequences,
        use_stream_lengths=from_file and args.sequence_length is None,
    )


class Session:
    """Client, model info, payloads, engine and statistics for one server."""

    def __init__(self) -> None:
        self.client: InferenceClient | None = None
        self.payloads: Payloads | None = None
        self.owns_payloads = True
        self.engine: LocalEngine | ProcessEngine | None = None
        self.info: ModelInfo | None = None
        self.settings: dict[str, Any] = {}
        self.levels: list[float] = []
        self.mode = "concurrency"
        self.include_server = False
        self.args: argparse.Namespace | None = None

    @classmethod
    def open(cls, url: str, args: argparse.Namespace, shared: Session | None = None) -> Session:
        """Prepare everything for a run against `url`; with `shared`, reuse its payloads and regions."""
        s = cls()
        try:
            s._open(url, args, shared)
        except BaseException:
            s.close()
            raise
        return s

    def _open(self, url: str, args: argparse.Namespace, shared: Session | None) -> None:
        self.args = args
        self.client = connect(url, args.rpc_timeout)
        info = fetch_model_info(self.client, args.model, args.model_version)
        self.info = info
        check_batch_size(info, args.batch_size)
        if info.is_decoupled and not args.streaming:
            raise ConfigError(f"model '{info.name}' is decoupled; it can only be driven with --streaming")
        if info.is_sequence and args.batch_size != 1:
            raise ConfigError(f"model '{info.name}' is a sequence model; its requests need -b 1")
        dims = resolve_dims(info, parse_shape_options(args.shape))
        from_file = args.input_data not in ("random", "zero")
        if shared is not None and shared.payloads is not None:
            self.payloads, self.owns_payloads = shared.payloads, False
        else:
            streams = (
                json_steps(info, dims, args.input_data)
                if from_file
                else synthetic_steps(info, dims, args.input_data, args.string_length, args.string_data, args.seed)
            )
            self.payloads = build_payloads(
                info,
                streams,
                args.batch_size,
                args.shared_memory,
                args.output_shared_memory_size,
                decoupled_stream=info.is_decoupled,
            )
        if self.payloads.shm is not None:
            self.payloads.shm.register(self.client)
        self.mode = "request_rate" if args.request_rate_range else "concurrency"
        self.levels = levels_of(args.request_rate_range or args.concurrency_range or (1, 1, 1))
        seq = sequence_spec(args, info, len(self.payloads.streams), from_file)
        if seq is not None and self.mode == "concurrency":
            span = seq.id_end - seq.id_start + 1
            if span < max(self.levels):
                raise ConfigError(f"--sequence-id-range holds {span} ids but concurrency goes to {max(self.levels):g}")
        spec = LoadSpec(
            mode=self.mode,
            transport=args.transport,
            streaming=args.streaming,
            use_async=args.use_async,
            max_threads=args.max_threads,
            distribution=args.request_distribution,
            sequence=seq,
            decoupled=info.is_decoupled,
            seed=args.seed,
        )
        if args.processes > 1:
            self.engine = ProcessEngine(url, self.payloads.streams, spec, args.processes)
        else:
            self.engine = LocalEngine(self.client, self.payloads.streams, spec)
        self.include_server = "statistics" in info.server_extensions
        self.settings = {
            "url": url,
            "model": info.name,
            "model_version": info.version,
            "mode": self.mode,
            "levels": self.levels,
            "batch_size": args.batch_size,
            "streaming": args.streaming,
            "transport": "grpc" if args.streaming else args.transport,
            "async": args.use_async,
            "shared_memory": args.shared_memory,
            "input_data": args.input_data,
            "processes": args.processes,
            "max_threads": args.max_threads,
            "measurement_interval_ms": args.measurement_interval,
            "stability_percentage": args.stability_percentage,
            "max_trials": args.max_trials,
            "percentile": args.percentile,
            "latency_threshold_ms": args.latency_threshold,
            "request_distribution": args.request_distribution if self.mode == "request_rate" else None,
            "sequence": asdict(seq) if seq else None,
            "request_bytes": self.payloads.request_bytes,
        }

    def server_stats(self) -> ServerStats | None:
        """Cumulative statistics of the model under test (None when the server has no statistics)."""
        if not self.include_server or self.client is None or self.info is None:
            return None
        try:
            resp = self.client.model_statistics(self.info.name, self.info.version)
        except ClientError:
            return None
        return ServerStats.from_response(resp, self.info.name, self.info.version)

    def profiler(self, progress: Progress | None = None, verbose: bool = False, out: TextIO | None = None) -> Profiler:
        """A profiler over this session's engine with the CLI's measurement settings."""
        assert self.engine is not None and self.args is not None
        args = self.args

        def on_window(trial: int, w: Measurement) -> None:
            if progress is not None and hasattr(progress, "clear"):
                progress.clear()
            stream = out or sys.stdout
            stream.write(
                f"  Pass [{trial + 1}] throughput: {w.infer_per_sec:.6g} infer/sec. "
                f"Avg latency: {w.avg_ns / 1000:.0f} usec (std {w.std_ns / 1000:.0f} usec)\n"
            )
            stream.flush()

        return Profiler(
            self.engine,
            self.server_stats,
            mode=self.mode,
            batch_size=args.batch_size,
            window_ms=args.measurement_interval,
            stability=args.stability_percentage / 100.0,
            max_trials=args.max_trials,
            percentile=args.percentile,
            latency_threshold_ms=args.latency_threshold,
            progress=progress,
            on_window=on_window if verbose else None,
        )

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop load, reap workers, unregister and remove shared memory, close the channel."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        if self.payloads is not None and self.owns_payloads:
            self.payloads.close()
        elif self.payloads is not None and self.payloads.shm is not None and self.client is not None:
            self.payloads.shm.unregister(self.client)
        self.payloads = None
        if self.client is not None:
            self.client.close()
            self.client = None
