"""The HTTP, metrics and placement flag groups of the command line (Triton's names)."""

from __future__ import annotations

import argparse
import os

from service.config.values import parse_bool


def add_http_flags(p: argparse.ArgumentParser) -> None:
    """The HTTP/REST endpoint's flags (Triton's names)."""
    p.add_argument(
        "--allow-http", type=parse_bool, default=True, metavar="BOOL", help="serve the HTTP/REST endpoint (true)"
    )
    p.add_argument(
        "--http-port", type=int, default=8000, metavar="PORT", help="port of the HTTP/REST endpoint; 0 picks one (8000)"
    )
    p.add_argument(
        "--http-address", default="0.0.0.0", metavar="ADDR", help="address the HTTP endpoint binds to (0.0.0.0)"
    )
    p.add_argument(
        "--http-thread-count",
        type=int,
        default=8,
        metavar="N",
        help="accepted for Triton compatibility; Trireme serves HTTP on its single event loop",
    )
    p.add_argument(
        "--http-max-input-size",
        type=int,
        default=64 << 20,
        metavar="BYTES",
        help="largest HTTP request body accepted, after decompression (67108864 = 64 MiB)",
    )
    p.add_argument(
        "--http-header-forward-pattern",
        default="",
        metavar="REGEX",
        help="HTTP headers whose name matches are passed to the model as string request parameters (none)",
    )
    p.add_argument(
        "--reuse-http-port",
        type=parse_bool,
        default=False,
        metavar="BOOL",
        help="bind the HTTP port with SO_REUSEPORT so several servers can share it (false)",
    )


def add_metrics_flags(p: argparse.ArgumentParser) -> None:
    """The Prometheus metrics endpoint's flags (Triton's names; docs/metrics.md)."""
    p.add_argument(
        "--allow-metrics", type=parse_bool, default=True, metavar="BOOL", help="serve Prometheus metrics (true)"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=8002,
        metavar="PORT",
        help="port of the metrics endpoint; 0 picks one (8002)",
    )
    p.add_argument(
        "--metrics-address",
        default="",
        metavar="ADDR",
        help="address the metrics endpoint binds to (the --http-address)",
    )
    p.add_argument(
        "--metrics-interval-ms",
        type=int,
        default=2000,
        metavar="MS",
        help="how often CPU and GPU gauges are sampled (2000)",
    )
    p.add_argument(
        "--metrics-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="metrics setting, repeatable: counter_latencies, summary_latencies, summary_quantiles, "
        "histogram_latencies (Triton's keys), trireme_histograms",
    )
    p.add_argument(
        "--allow-cpu-metrics",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="report CPU utilisation and memory (true)",
    )
    p.add_argument(
        "--allow-gpu-metrics",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="report GPU gauges when a GPU is visible (true)",
    )


def add_placement_flags(p: argparse.ArgumentParser) -> None:
    """Where model code comes from and where it runs: custom backends and host policies (Triton's names)."""
    p.add_argument(
        "--backend-directory",
        default="",
        metavar="DIR",
        help="Python-based backends: DIR/<name>/model.py (a TritonPythonModel) serves every model whose config "
        'says backend: "<name>"; built-in backends need nothing here (none)',
    )
    p.add_argument(
        "--host-policy",
        action="append",
        default=[],
        metavar="<name>,<setting>=<value>",
        help="pins instances whose instance_group names host_policy <name> (default names: cpu, gpu_<id>, "
        "model): numa-node=<id> binds their memory (and cores) to that NUMA node, cpu-cores=<list> (0-3,8) their "
        "threads to those cores; repeatable (none)",
    )


def default_frontend_processes() -> int:
    """--frontend-processes when not given: $TRIREME_FRONTEND_PROCESSES, else 1 on a machine with 2 usable cores
    or fewer (a second front end has no core of its own there: measured slower, docs/benchmarks.md), else half
    the usable cores (the core process, the model instances and the clients need the rest), at most 4: a front
    end spends ~4x the core process's CPU per request (measured), so past 4 the core process is the bound."""
    env = os.environ.get("TRIREME_FRONTEND_PROCESSES", "")
    if env.strip().isdigit() and int(env) > 0:
        return int(env)
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return 1 if cores <= 2 else min(4, cores // 2)


def add_frontend_flags(p: argparse.ArgumentParser) -> None:
    """How many processes serve the gRPC and HTTP ports (docs/architecture.md, "Using more cores")."""
    p.add_argument(
        "--frontend-processes",
        type=int,
        default=None,
        metavar="N",
        help="Trireme only: N >= 2 runs N front-end processes sharing the gRPC and HTTP ports (SO_REUSEPORT) over "
        "one core process that keeps the models, schedulers, statistics and shared-memory registry; 1 serves "
        "everything from one process (default: $TRIREME_FRONTEND_PROCESSES, else 1 with <= 2 cores, else "
        "half the cores, at most 4)",
    )
