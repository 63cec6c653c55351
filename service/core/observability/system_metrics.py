"""Server-wide gauges sampled every --metrics-interval-ms: CPU utilisation and memory (psutil), and GPU gauges
through NVML when a GPU is visible (pynvml imported lazily; without it or without a GPU none are exported)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import psutil
from prometheus_client.metrics_core import Metric

log = logging.getLogger("trireme.metrics")

_GPU_GAUGES = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "utilization"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "memory_total"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "memory_used"),
    ("nv_gpu_power_usage", "GPU power usage in watts", "power_usage"),
    ("nv_gpu_power_limit", "GPU power management limit in watts", "power_limit"),
)


class SystemSampler:
    """Holds the last sample of the CPU (and GPU) gauges; `sample()` refreshes it."""

    def __init__(self, cpu: bool = True, gpu: bool = True, gpu_count: int = 0) -> None:
        self.cpu = cpu
        self.cpu_utilization = 0.0
        self.memory_total = 0
        self.memory_used = 0
        self._nvml: Any = None
        self._gpus: list[tuple[str, Any]] = []  # (uuid, handle)
        self._energy_start: dict[str, float] = {}
        self.gpu_values: dict[str, dict[str, float]] = {}
        if cpu:
            psutil.cpu_percent(interval=None)  # the first call starts the measuring interval
        if gpu and gpu_count > 0:
            self._open_nvml()

    def _open_nvml(self) -> None:
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                self._gpus.append((uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle))
            self._nvml = pynvml
        except Exception as e:  # no pynvml, or NVML refuses: export no GPU gauges, as Triton does without DCGM
            log.warning("GPU metrics unavailable: %s", e)
            self._gpus = []

    def sample(self) -> None:
        """Refresh every gauge (utilisation is averaged over the time since the previous sample)."""
        if self.cpu:
            self.cpu_utilization = psutil.cpu_percent(interval=None) / 100.0
            memory = psutil.virtual_memory()
            self.memory_total = int(memory.total)
            self.memory_used = int(memory.total - memory.available)
        nvml = self._nvml
        for uuid, handle in self._gpus:
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                energy = nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0
                start = self._energy_start.setdefault(uuid, energy)
                self.gpu_values[uuid] = {
                    "utilization": nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                    "memory_total": float(mem.total),
                    "memory_used": float(mem.used),
                    "power_usage": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                    "power_limit": nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0,
                    "energy": energy - start,
                }
            except Exception as e:
                log.debug("sampling GPU %s failed: %s", uuid, e)

    def collect(self) -> Iterator[Metric]:
        """Triton's server-wide families (pinned memory is always 0: Trireme has no pinned pool)."""
        for name, doc in (
            ("nv_pinned_memory_pool_total_bytes", "Pinned memory pool total memory size, in bytes"),
            ("nv_pinned_memory_pool_used_bytes", "Pinned memory pool used memory size, in bytes"),
        ):
            m = Metric(name, doc, "gauge")
            m.add_sample(name, {}, 0)
            yield m
        if self.cpu:
            for name, doc, value in (
                ("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", self.cpu_utilization),
                ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", self.memory_total),
                ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", self.memory_used),
            ):
                m = Metric(name, doc, "gauge")
                m.add_sample(name, {}, value)
                yield m
        if not self.gpu_values:
            return
        for name, doc, key in _GPU_GAUGES:
            m = Metric(name, doc, "gauge")
            for uuid, values in sorted(self.gpu_values.items()):
                m.add_sample(name, {"gpu_uuid": uuid}, values[key])
            yield m
        energy = Metric(
            "nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started", "counter"
        )
        for uuid, values in sorted(self.gpu_values.items()):
            energy.add_sample(energy.name, {"gpu_uuid": uuid}, values["energy"])
        yield energy
