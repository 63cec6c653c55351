"""Unit tests of the metrics pieces that need no server: text rendering, --metrics-config, histograms, the
custom-metrics registry's reference counting, and the GPU gauges (with a stand-in NVML module)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from service.core.observability.custom_metrics import COUNTER, HISTOGRAM, CustomMetrics, MetricsError
from service.core.observability.metrics import MetricsConfig, bound_text, parse_metrics_config
from service.core.observability.stats import LatencyHistogram
from service.core.observability.system_metrics import SystemSampler
from service.frontend.metrics import format_value, render
from service.ipc import frames as ipc


class _Families:
    def __init__(self, *metrics: Metric) -> None:
        self.metrics = metrics

    def collect(self) -> Any:
        return iter(self.metrics)


def test_render_keeps_triton_names_and_number_format() -> None:
    counter = Metric("nv_inference_count", "Number of inferences", "counter")
    counter.add_sample("nv_inference_count", {"version": "1", "model": 'a"b'}, 5)
    empty = Metric("nothing", "no samples", "gauge")
    text = render([_Families(counter, empty)]).decode()
    assert text == (
        "# HELP nv_inference_count Number of inferences\n"
        "# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="a\\"b",version="1"} 5\n'
    )
    (family,) = text_string_to_metric_families(text)
    assert family.samples[0].labels == {"model": 'a"b', "version": "1"}
    assert [format_value(v) for v in (3, 3.0, 0.25, float("nan"), float("inf"))] == ["3", "3", "0.25", "NaN", "+Inf"]
    assert [bound_text(b) for b in (0.0001, 1.0, 2.5, 10.0)] == ["0.0001", "1", "2.5", "10"]


def test_metrics_config_keys() -> None:
    config = parse_metrics_config(
        ["summary_latencies=true", "counter_latencies=false", "summary_quantiles=0.5:0.05,0.99:0.001", "bogus=1"]
    )
    assert config.summary_latencies and not config.counter_latencies
    assert config.summary_quantiles == [(0.5, 0.05), (0.99, 0.001)]
    assert parse_metrics_config(["histogram_latencies=maybe"]) == MetricsConfig()  # bad value: ignored


def test_latency_histogram_buckets_are_le() -> None:
    h = LatencyHistogram()
    for ns in (100_000, 100_001, 2_000_000_000, 10**12):
        h.observe(ns)
    cumulative = dict(h.cumulative())
    assert cumulative[0.0001] == 1  # exactly on a bound counts in that bucket
    assert cumulative[0.00025] == 2
    assert cumulative[2.5] == 3
    assert cumulative[float("inf")] == 4


class _Worker:
    def __init__(self) -> None:
        self.exited = False


def test_custom_metrics_reference_counting() -> None:
    registry = CustomMetrics()
    a, b = _Worker(), _Worker()
    family = registry.new_family(a, "app_total", "first", COUNTER)
    assert registry.new_family(b, "app_total", "second", COUNTER) == family
    with pytest.raises(MetricsError):
        registry.new_family(b, "app_total", "x", HISTOGRAM)
    m1 = registry.new_metric(a, family, {"k": "v"}, None)
    m2 = registry.new_metric(b, family, {"k": "v"}, None)
    assert m1 == m2
    registry.apply(a, [(ipc.METRIC_INCREMENT, m1, 2.0)])
    registry.apply(b, [(ipc.METRIC_INCREMENT, m2, 3.0)])
    assert registry.value(m1) == 5.0
    registry.apply(a, [(ipc.METRIC_DELETE, m1, 0.0), (ipc.METRIC_FAMILY_DELETE, family, 0.0)])
    (exported,) = list(registry.collect())
    assert exported.documentation == "first" and exported.samples[0].value == 5.0
    b.exited = True  # b's process exited: what it held goes away
    assert list(registry.collect()) == []
    assert registry.families == {}


def test_gpu_gauges_with_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    memory = types.SimpleNamespace(total=80 << 30, used=1 << 30)
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: "GPU-0000",
        nvmlDeviceGetMemoryInfo=lambda h: memory,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: 5000,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=50),
        nvmlDeviceGetPowerUsage=lambda h: 300_000,
        nvmlDeviceGetPowerManagementLimit=lambda h: 700_000,
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sampler = SystemSampler(cpu=False, gpu=True, gpu_count=1)
    sampler.sample()
    families = {m.name: m for m in sampler.collect()}
    assert "nv_cpu_utilization" not in families
    assert families["nv_gpu_utilization"].samples[0].labels == {"gpu_uuid": "GPU-0000"}
    assert families["nv_gpu_utilization"].samples[0].value == 0.5
    assert families["nv_gpu_power_usage"].samples[0].value == 300.0
    assert families["nv_gpu_memory_total_bytes"].samples[0].value == 80 << 30
    assert families["nv_energy_consumption"].samples[0].value == 0.0
    assert "nv_gpu_utilization" not in {m.name for m in SystemSampler(cpu=True, gpu=True, gpu_count=0).collect()}
