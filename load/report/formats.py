"""Reports: perf_analyzer-style console blocks, a compact table, the -f CSV and the --json summary."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from load.measure.profiler import DEFAULT_PERCENTILES, LevelResult, Measurement


def percentiles_for(extra: int | None) -> list[int]:
    """The percentiles reported: 50, 90, 95, 99 and the --percentile value."""
    return sorted(set(DEFAULT_PERCENTILES) | ({extra} if extra else set()))


def level_key(mode: str) -> str:
    """CSV/JSON name of the level column."""
    return "Concurrency" if mode == "concurrency" else "Request Rate"


def _client_times_us(m: Measurement) -> tuple[float, float]:
    if not m.completed:
        return 0.0, 0.0
    return m.send_ns / m.completed / 1000.0, m.recv_ns / m.completed / 1000.0


def network_misc_us(m: Measurement) -> float:
    """perf_analyzer's "Network+Server Send/Recv": client wait minus server queue and compute, floored at 0."""
    send, recv = _client_times_us(m)
    wait = m.avg_ns / 1000.0 - send - recv
    if m.server is None:
        return max(0.0, wait)
    accounted = sum(m.server.avg_us(f) for f in ("queue", "compute_input", "compute_infer", "compute_output"))
    return max(0.0, wait - accounted)


def format_settings(settings: dict[str, Any]) -> str:
    """The '*** Measurement Settings ***' header."""
    lines = [
        "*** Measurement Settings ***",
        f"  Batch size: {settings['batch_size']}",
        "  Service Kind: TRITON (trireme-perf, gRPC)",
        '  Using "time_windows" mode for stabilization',
        f"  Stabilizing using {'p' + str(settings['percentile']) if settings.get('percentile') else 'average'}"
        " latency and throughput",
        f"  Measurement window: {settings['measurement_interval_ms']} msec",
    ]
    if settings.get("latency_threshold_ms"):
        lines.append(f"  Latency limit: {settings['latency_threshold_ms']:g} msec")
    if settings.get("streaming"):
        lines.append("  Using streaming calls for inference (grpc library)")
    elif settings.get("transport") == "h2":
        lines.append("  Using asynchronous calls for inference (trireme-perf HTTP/2 client)")
    else:
        calls = "asynchronous" if settings.get("async") else "synchronous"
        lines.append(f"  Using {calls} calls for inference (grpc library)")
    lines.append(f"  Client processes: {settings.get('processes', 1)}")
    if settings.get("sequence"):
        lines.append("  Sequence model: yes")
    return "\n".join(lines) + "\n"


def format_level(r: LevelResult, include_server: bool = True) -> str:
    """One level's block, in perf_analyzer's words."""
    m = r.merged
    out: list[str] = []
    if r.mode == "concurrency":
        out.append(f"Request concurrency: {r.level:g}")
    else:
        out.append(f"Request Rate: {r.level:g} inference requests per seconds")
    out.append("  Client: ")
    out.append(f"    Request count: {m.request_count}")
    if m.delayed and m.request_count and m.delayed / m.request_count > 0.1:
        send_rate = m.sent / (m.duration_ns / 1e9) if m.duration_ns else 0.0
        out.append(f"    Avg send request rate: {send_rate:.2f} infer/sec")
        out.append(
            "    [WARNING] trireme-perf was not able to keep up with the desired request rate. "
            f"{100.0 * m.delayed / m.request_count:.2f}% of the requests were delayed."
        )
    if m.sequences:
        out.append(f"    Sequence count: {m.sequences} ({m.sequences / (m.duration_ns / 1e9):.2f} seq/sec)")
    out.append(f"    Throughput: {m.infer_per_sec:.6g} infer/sec")
    if m.responses > m.request_count:
        out.append(f"    Response Throughput: {m.responses / (m.duration_ns / 1e9):.6g} infer/sec")
    if not r.percentile:
        out.append(f"    Avg latency: {m.avg_ns / 1000:.0f} usec (standard deviation {m.std_ns / 1000:.0f} usec)")
    for p in percentiles_for(r.percentile):
        out.append(f"    p{p} latency: {m.percentile_ns(p) // 1000} usec")
    send, recv = _client_times_us(m)
    total = m.avg_ns / 1000
    out.append(
        f"    Avg gRPC time: {total:.0f} usec ((un)marshal request/response {send + recv:.0f} usec + "
        f"response wait {max(0.0, total - send - recv):.0f} usec)"
    )
    if m.cpu_ns and m.request_count:
        out.append(
            f"    Client CPU: {m.cpu_ns / m.duration_ns:.2f} cores, "
            f"{m.cpu_ns / m.request_count / 1000:.0f} usec per request"
        )
    if include_server and m.server is not None:
        s = m.server
        out.append("  Server: ")
        if not s.count["success"]:
            out.append("    Request count: 0")
        else:
            d = s.to_dict()
            out.append(f"    Inference count: {s.inference_count}")
            out.append(f"    Execution count: {s.execution_count}")
            out.append(f"    Successful request count: {s.count['success']}")
            out.append(
                f"    Avg request latency: {d['avg_request_us']:.0f} usec (overhead {d['avg_overhead_us']:.0f} usec"
                f" + queue {d['avg_queue_us']:.0f} usec + compute input {d['avg_compute_input_us']:.0f} usec"
                f" + compute infer {d['avg_compute_infer_us']:.0f} usec"
                f" + compute output {d['avg_compute_output_us']:.0f} usec)"
            )
    if not r.stable:
        out.append("  [WARNING] not stable: " + ", ".join(f"{x:.1f}" for x in r.window_rates) + " infer/s per window")
        if r.unstable_reason:
            out.append(f"  [WARNING] {r.unstable_reason}")
    return "\n".join(out) + "\n"


def format_summary(results: Sequence[LevelResult]) -> str:
    """perf_analyzer's closing lines, then a compact table of every level."""
    if not results:
        return ""
    mode = results[0].mode
    name = "Concurrency" if mode == "concurrency" else "Request Rate"
    lines = ["Inferences/Second vs. Client Average Batch Latency"]
    for r in results:
        lines.append(
            f"{name}: {r.level:g}, throughput: {r.merged.infer_per_sec:.6g} infer/sec, "
            f"latency {r.merged.avg_ns / 1000:.0f} usec"
        )
    pcts = percentiles_for(results[0].percentile)
    head = [name, "infer/s", "send", "recv", "srv queue", "srv compute"] + [f"p{p}" for p in pcts]
    rows = [head]
    for r in results:
        m = r.merged
        send, recv = _client_times_us(m)
        queue = m.server.avg_us("queue") if m.server else float("nan")
        compute = (
            sum(m.server.avg_us(f) for f in ("compute_input", "compute_infer", "compute_output"))
            if m.server
            else float("nan")
        )
        rows.append(
            [f"{r.level:g}", f"{m.infer_per_sec:.1f}", f"{send:.0f}", f"{recv:.0f}", f"{queue:.0f}", f"{compute:.0f}"]
            + [str(m.percentile_ns(p) // 1000) for p in pcts]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines.append("")
    lines.append("Latencies in usec:")
    for row in rows:
        lines.append("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    return "\n".join(lines) + "\n"


def csv_rows(results: Sequence[LevelResult], include_server: bool, verbose: bool = False) -> list[list[str]]:
    """Header and rows in perf_analyzer's -f CSV layout (integer usec), sorted by throughput."""
    if not results:
        return []
    mode = results[0].mode
    pcts = percentiles_for(results[0].percentile)
    decoupled = any(r.merged.responses > r.merged.request_count for r in results)
    head = [level_key(mode), "Inferences/Second"]
    head += ["Response Throughput"] if decoupled else []
    head += ["Client Send"]
    if include_server:
        head += ["Network+Server Send/Recv", "Server Queue", "Server Compute Input", "Server Compute Infer"]
        head += ["Server Compute Output"]
    head += ["Client Recv"] + [f"p{p} latency" for p in pcts]
    if verbose:
        head += (["Avg latency"] if not results[0].percentile else []) + ["request/response", "response wait"]
    rows = [head]
    for r in sorted(results, key=lambda x: x.merged.infer_per_sec):
        m = r.merged
        send, recv = _client_times_us(m)
        row = [f"{r.level:g}", f"{m.infer_per_sec:.6g}"]
        if decoupled:
            row.append(f"{m.responses / (m.duration_ns / 1e9):.6g}")
        row.append(str(int(send)))
        if include_server:
            s = m.server
            row.append(str(int(network_misc_us(m))))
            for f in ("queue", "compute_input", "compute_infer", "compute_output"):
                row.append(str(int(s.avg_us(f))) if s else "0")
        row.append(str(int(recv)))
        row += [str(m.percentile_ns(p) // 1000) for p in pcts]
        if verbose:
            avg = m.avg_ns / 1000
            row += ([str(int(avg))] if not r.percentile else []) + [str(int(send + recv)), str(int(avg - send - recv))]
        rows.append(row)
    return rows


def write_csv(path: str, results: Sequence[LevelResult], include_server: bool, verbose: bool = False) -> None:
    """Write the -f CSV file."""
    with Path(path).open("w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(csv_rows(results, include_server, verbose))


def result_dict(r: LevelResult) -> dict[str, Any]:
    """One level as JSON-friendly data (latencies in usec)."""
    m = r.merged
    send, recv = _client_times_us(m)
    seconds = m.duration_ns / 1e9 if m.duration_ns else 1.0
    lat: dict[str, float] = {"avg": m.avg_ns / 1000, "std": m.std_ns / 1000}
    lat.update({f"p{p}": m.percentile_ns(p) / 1000 for p in percentiles_for(r.percentile)})
    return {
        ("concurrency" if r.mode == "concurrency" else "request_rate"): r.level,
        "stable": r.stable,
        "unstable_reason": r.unstable_reason,
        "infer_per_sec": m.infer_per_sec,
        "request_count": m.request_count,
        "response_count": m.responses,
        "duration_s": seconds,
        "window_infer_per_sec": r.window_rates,
        "latency_us": lat,
        "client": {
            "send_us": send,
            "recv_us": recv,
            "network_server_us": network_misc_us(m),
            "cpu_cores": m.cpu_ns / m.duration_ns if m.duration_ns else 0.0,
            "cpu_us_per_request": m.cpu_ns / m.request_count / 1000 if m.request_count else 0.0,
        },
        "sequence_count": m.sequences,
        "delayed_count": m.delayed,
        "send_rate": m.sent / seconds,
        "server": m.server.to_dict() if m.server else None,
    }


def summary_dict(settings: dict[str, Any], results: Sequence[LevelResult], error: str | None) -> dict[str, Any]:
    """The --json document."""
    return {"tool": "trireme-perf", "settings": settings, "results": [result_dict(r) for r in results], "error": error}


def write_json(path: str, doc: dict[str, Any]) -> None:
    """Write the --json summary ('-' for stdout)."""
    text = json.dumps(doc, indent=2, sort_keys=False)
    if path == "-":
        sys.stdout.write(text + "\n")
    else:
        Path(path).write_text(text + "\n")


class ProgressLine:
    """A single refreshed status line on a terminal (nothing when the stream is not a TTY)."""

    def __init__(self, stream: TextIO, enabled: bool | None = None) -> None:
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self._width = 0

    def __call__(self, text: str) -> None:
        if not self.enabled:
            return
        pad = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        """Erase the line before regular output."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
