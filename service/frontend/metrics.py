"""The metrics endpoint (Triton's port 8002): GET /metrics answers Prometheus text built from the core's collectors.

Runs as an aiohttp site on the server's own event loop. Rendering follows Triton's output (prometheus-cpp):
counters keep their names (no `_total` added, unlike prometheus_client's generate_latest), integral values print
as integers, labels are sorted with `le`/`quantile` last. Like Triton, only GET is allowed (405 otherwise) and
paths other than /metrics answer 200 with an empty body.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from collections.abc import Iterable
from typing import Any, Protocol

from aiohttp import web
from prometheus_client.metrics_core import Metric

log = logging.getLogger("trireme.metrics")

CONTENT_TYPE = "text/plain; charset=utf-8"  # what Triton answers
_METRICS_PATH = re.compile(r"/metrics/?")
_LAST_LABELS = ("le", "quantile")


class Collector(Protocol):
    """prometheus_client's collector protocol: families built at scrape time."""

    def collect(self) -> Iterable[Metric]:
        """Every metric family this collector exports."""


def format_value(value: float) -> str:
    """A sample value as prometheus-cpp prints it: 3 not 3.0, NaN, +Inf."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels_text(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    keys = sorted(k for k in labels if k not in _LAST_LABELS) + [k for k in _LAST_LABELS if k in labels]
    return "{" + ",".join(f'{k}="{_escape_label(str(labels[k]))}"' for k in keys) + "}"


def render(collectors: Iterable[Collector]) -> bytes:
    """The Prometheus text exposition of every family (families without samples are left out, as Triton does)."""
    lines: list[str] = []
    for collector in collectors:
        for metric in collector.collect():
            if not metric.samples:
                continue
            doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            lines.append(f"# HELP {metric.name} {doc}")
            lines.append(f"# TYPE {metric.name} {metric.type}")
            for s in metric.samples:
                lines.append(f"{s.name}{_labels_text(s.labels)} {format_value(s.value)}")
    lines.append("")
    return "\n".join(lines).encode()


class MetricsService:
    """The HTTP listener plus the periodic sampling of server-wide gauges."""

    def __init__(self, collectors: list[Collector], sampler: Any = None, interval_ms: int = 2000) -> None:
        self.collectors = collectors
        self.sampler = sampler  # core.system_metrics.SystemSampler or None
        self.interval_s = max(0.05, interval_ms / 1000.0)
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._sampling: asyncio.Task[None] | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        if request.method != "GET":
            return web.Response(status=405)
        if not _METRICS_PATH.fullmatch(request.path):
            return web.Response(status=200)
        # one turn of the loop first: a metric update a model sent just before it scraped is already in its
        # control socket, and this turn's poll applies it (custom metrics are visible at once, as in Triton)
        await asyncio.sleep(0)
        return web.Response(body=render(self.collectors), headers={"Content-Type": CONTENT_TYPE})

    async def start(self, address: str, port: int) -> int:
        """Listen on address:port (0 = any free port); returns the bound port."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, address, port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound = runner.addresses  # the port actually bound (port 0 = any free port)
        self.port = int(bound[0][1]) if bound else port
        if self.sampler is not None:
            self.sampler.sample()
            self._sampling = asyncio.get_running_loop().create_task(self._sample_forever())
        return self.port

    async def _sample_forever(self) -> None:
        sampler = self.sampler
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                sampler.sample()
            except Exception:
                log.exception("sampling server metrics failed")

    async def stop(self) -> None:
        """Stop sampling and close the listener."""
        if self._sampling is not None:
            self._sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampling
            self._sampling = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
