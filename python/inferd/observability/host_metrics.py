"""The machine's figures: host CPU and memory from ``/proc`` at scrape time, GPU figures from
NVML when ``nvidia-ml-py`` and a GPU are there."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = structlog.get_logger(__name__)


class HostCollector(Collector):
    """Triton's host figures, from ``/proc`` at scrape time: ``nv_cpu_utilization``, the share
    of all cores' time that was busy since the previous scrape (since the server started, at the
    first), from ``/proc/stat`` as Triton reads it (busy: user, nice, system, irq, softirq,
    steal; idle: idle, iowait); ``nv_cpu_memory_total_bytes`` and ``nv_cpu_memory_used_bytes``
    (MemTotal - MemAvailable, as Triton), from ``/proc/meminfo``. A figure that cannot be read
    (no ``/proc``: not Linux) is left out."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._stat = proc / "stat"
        self._meminfo = proc / "meminfo"
        self._lock = threading.Lock()  # scrapes may run on several threads at once
        self._previous = self._cpu_times()

    def _cpu_times(self) -> tuple[int, int] | None:
        """(busy, idle) jiffies of all cores together, or None when unreadable."""
        try:
            with self._stat.open(encoding="ascii") as stat:
                fields = stat.readline().split()
            if fields[:1] != ["cpu"]:
                return None
            user, nice, system, idle, iowait, irq, softirq, steal = (
                int(f) for f in (fields[1:9] + ["0"] * 8)[:8]
            )
        except (OSError, ValueError):
            return None
        return user + nice + system + irq + softirq + steal, idle + iowait

    def _memory(self) -> tuple[int, int] | None:
        """(total, used) bytes, or None when unreadable."""
        values: dict[str, int] = {}
        try:
            for line in self._meminfo.read_text(encoding="ascii").splitlines():
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    values[key] = int(rest.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            return None
        if len(values) < 2:
            return None
        total = values["MemTotal"]
        return total, max(total - values["MemAvailable"], 0)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now, previous = self._cpu_times(), self._previous
            if now is not None:
                self._previous = now
        if now is not None:
            busy, idle = now
            if previous is not None:
                busy, idle = max(busy - previous[0], 0), max(idle - previous[1], 0)
            utilisation = GaugeMetricFamily(
                "nv_cpu_utilization",
                "Host CPU utilization, all cores, since the previous scrape (0..1)",
            )
            utilisation.add_metric([], busy / (busy + idle) if busy + idle else 0.0)
            yield utilisation
        memory = self._memory()
        if memory is not None:
            total, used = memory
            yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "Host total memory", total)
            yield GaugeMetricFamily(
                "nv_cpu_memory_used_bytes", "Host used memory (total - available)", used
            )


class GpuCollector(Collector):
    """Utilisation and memory of each GPU through NVML; nothing when NVML is absent."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    @classmethod
    def create(cls) -> GpuCollector | None:
        try:
            import pynvml  # nvidia-ml-py, in the gpu extra
        except ImportError:
            log.info("gpu metrics off", reason="nvidia-ml-py is not installed")
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            log.info("gpu metrics off", reason=f"NVML: {e}")
            return None
        return cls(pynvml)

    def collect(self) -> Iterator[Metric]:
        nvml = self._nvml
        labels = ("gpu_uuid",)
        utilisation = GaugeMetricFamily(
            "nv_gpu_utilization", "GPU utilization (0..1)", labels=labels
        )
        used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU used memory", labels=labels)
        total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU total memory", labels=labels)
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            utilisation.add_metric([uuid], nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100)
            used.add_metric([uuid], memory.used)
            total.add_metric([uuid], memory.total)
        yield from (utilisation, used, total)
