"""Prometheus metrics on ``/metrics``, with Triton's families and names: the server's registry,
which gathers the collectors of its neighbours.

Counts, cumulative durations and histograms are read from the core's counters at scrape time
(``core_metrics.py``, over ``model_counters.py``'s types); only failures are counted here, by
reason, as they happen (``failure_counts.py``), and so are failed model loads. Host CPU and
memory, and GPU figures, are read at scrape time (``host_metrics.py``); ``metrics_http.py`` is
the endpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

from inferd.errors import ErrorCode
from inferd.observability.cache_metrics import ResponseCacheCollector
from inferd.observability.core_metrics import CoreStatisticsCollector
from inferd.observability.failure_counts import FAILURE_REASONS, FailureCounts
from inferd.observability.host_metrics import GpuCollector, HostCollector
from inferd.observability.metrics_http import MetricsEndpoint
from inferd.observability.model_counters import ModelCounters

if TYPE_CHECKING:
    from inferd.core import ResponseCache, SequenceStateMemory


class InferenceMetrics:
    """The server's metrics registry (its own, not prometheus_client's global one).
    ``loaded``: the loaded versions as (model, version), cheaper than ``snapshot`` (default:
    read from it)."""

    def __init__(
        self,
        snapshot: Callable[[], list[ModelCounters]],
        *,
        gpu: bool = True,
        loaded: Callable[[], Iterable[tuple[str, str]]] | None = None,
        proc: Path = Path("/proc"),
        state_memory: SequenceStateMemory | None = None,
        response_cache: ResponseCache | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        caching = response_cache is not None
        self.registry.register(CoreStatisticsCollector(snapshot, caching=caching))
        self.registry.register(HostCollector(proc))
        gpu_collector = GpuCollector.create() if gpu else None
        if gpu_collector is not None:
            self.registry.register(gpu_collector)
        self.failures = FailureCounts(loaded or (lambda: [(c.name, c.version) for c in snapshot()]))
        self.registry.register(self.failures)
        self._load_failures = Counter(
            "inferd_model_load_failures",
            "Failed loads of a model (any of its versions), at startup or through load calls",
            ["model"],
            registry=self.registry,
        )
        if state_memory is not None:
            self._state_memory(state_memory)
        if response_cache is not None:
            self.registry.register(ResponseCacheCollector(response_cache))
        self._endpoint = MetricsEndpoint(self.registry)

    def _state_memory(self, memory: SequenceStateMemory) -> None:
        """What stateful models' implicit state holds, read at scrape time, and its bound."""
        held = Gauge(
            "inferd_sequence_state_bytes",
            "Bytes held by stateful models' implicit state, every sequence of every model",
            registry=self.registry,
        )
        held.set_function(lambda: memory.used)
        limit = Gauge(
            "inferd_sequence_state_limit_bytes",
            "The bound on inferd_sequence_state_bytes (--max-sequence-state-bytes)",
            registry=self.registry,
        )
        limit.set(memory.limit)

    def failed(self, model: str, version: str, code: ErrorCode) -> None:
        self.failures.count(model, version, FAILURE_REASONS.get(code, "OTHER"))

    def load_failed(self, model: str) -> None:
        """A load of ``model`` failed (``ModelRegistry`` calls it, from any thread)."""
        self._load_failures.labels(model=model).inc()

    def serve(self, host: str, port: int) -> int:
        """Starts ``/metrics`` on a thread of its own; returns the bound port."""
        return self._endpoint.serve(host, port)

    def close(self) -> None:
        self._endpoint.close()
