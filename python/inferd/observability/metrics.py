"""Prometheus metrics on ``/metrics``, with Triton's families and names.

Counts and cumulative durations are read from the core's counters at scrape time, the same ones
``ModelStatistics`` answers with, so the two never disagree; so are the latency, queue-time and
batch-size histograms, which the core keeps. Only failures are counted here, by reason, as they
happen (a request the core refuses never reaches its counters), and so are failed model loads.
Host CPU and memory come from ``/proc`` at scrape time; GPU figures from NVML when
``nvidia-ml-py`` and a GPU are there.

The endpoint answers ``/metrics`` only (any other path is 404) and writes no ``*_created``
series, whatever collector the registry holds.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import structlog
from prometheus_client import CollectorRegistry, Counter, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from inferd.errors import ErrorCode

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

    from inferd._core import (
        Duration,
        EnsembleStepStatistics,
        LatencyHistogram,
        StatisticsSnapshot,
    )

log = structlog.get_logger(__name__)

MODEL_LABELS = ("model", "version")

# Triton's failure reasons: refused by a queue policy, cancelled, failed in the backend, other.
FAILURE_REASONS: dict[ErrorCode, str] = {
    ErrorCode.RESOURCE_EXHAUSTED: "REJECTED",
    ErrorCode.UNAVAILABLE: "REJECTED",
    ErrorCode.DEADLINE_EXCEEDED: "REJECTED",
    ErrorCode.CANCELLED: "CANCELED",
    ErrorCode.INTERNAL: "BACKEND",
}
# Every reason Triton reports, each a series from a version's load on (0 until it happens).
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
METRICS_PATH = "/metrics"


@dataclass(frozen=True)
class EnsembleStepCounters:
    """One step of an ensemble version: its index in the config's steps, the composing model
    it runs, and its core statistics (``EnsembleScheduler.step_statistics``)."""

    step: int
    model: str
    statistics: EnsembleStepStatistics


@dataclass(frozen=True)
class ModelCounters:
    """One loaded version's core statistics, as ``ModelScheduler.statistics`` gives them, and
    its queue depth; an ensemble's version also has its steps'."""

    name: str
    version: str
    statistics: StatisticsSnapshot
    pending: int
    steps: tuple[EnsembleStepCounters, ...] = ()


class CoreStatisticsCollector(Collector):
    """Triton's counters, read from the core at scrape time. ``snapshot`` runs on the HTTP
    server's thread: it must only read (the registry gives it an immutable tuple)."""

    def __init__(self, snapshot: Callable[[], list[ModelCounters]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        counters = self._snapshot()

        def counter(name: str, doc: str, value: Callable[[ModelCounters], float]) -> Metric:
            # Triton's exact names, which carry no _total suffix, so that dashboards and alerts
            # built for Triton work unchanged. prometheus-client writes a counter only with
            # _total, so these go out untyped; each is cumulative and never goes down.
            metric = Metric(name, f"{doc} (cumulative)", "unknown")
            for c in counters:
                metric.add_sample(name, {"model": c.name, "version": c.version}, value(c))
            return metric

        yield counter(
            "nv_inference_request_success",
            "Number of successful inference requests, all batch sizes",
            lambda c: c.statistics.success.count,
        )
        yield counter(
            "nv_inference_count",
            "Number of inferences performed (rows: a batch of 4 counts 4)",
            lambda c: c.statistics.inference_count,
        )
        yield counter(
            "nv_inference_exec_count",
            "Number of model executions performed (batches)",
            lambda c: c.statistics.execution_count,
        )
        durations: tuple[tuple[Callable[[StatisticsSnapshot], Duration], str, str], ...] = (
            (
                lambda s: s.success,
                "nv_inference_request_duration_us",
                "Cumulative request duration",
            ),
            (
                lambda s: s.queue,
                "nv_inference_queue_duration_us",
                "Cumulative time requests spent queued",
            ),
            (
                lambda s: s.compute_input,
                "nv_inference_compute_input_duration_us",
                "Cumulative compute input duration (batch assembly)",
            ),
            (
                lambda s: s.compute_infer,
                "nv_inference_compute_infer_duration_us",
                "Cumulative compute inference duration",
            ),
            (
                lambda s: s.compute_output,
                "nv_inference_compute_output_duration_us",
                "Cumulative compute output duration (scatter)",
            ),
        )
        for duration, name, doc in durations:
            yield counter(name, f"{doc} in microseconds", _cumulative_us(duration))
        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count",
            "Instantaneous number of requests waiting in the model's queue",
            labels=MODEL_LABELS,
        )
        batch_sizes = HistogramMetricFamily(
            "inferd_batch_size",
            "Rows per executed batch",
            labels=MODEL_LABELS,
        )
        for c in counters:
            pending.add_metric([c.name, c.version], c.pending)
            buckets, running, total = [], 0, 0
            for size, batch in sorted(c.statistics.batches.items()):
                executions = batch.compute_infer.count
                running += executions
                total += size * executions
                buckets.append((str(float(size)), running))
            buckets.append(("+Inf", running))
            batch_sizes.add_metric([c.name, c.version], buckets, sum_value=total)
        yield pending
        yield batch_sizes
        histograms: tuple[
            tuple[Callable[[StatisticsSnapshot], LatencyHistogram], str, str], ...
        ] = (
            (
                lambda s: s.request_duration,
                "inferd_request_duration_us",
                "Request latency in the core in microseconds, from its queueing to its answer",
            ),
            (
                lambda s: s.queue_duration,
                "inferd_queue_duration_us",
                "Time a request waited in the core's queue, in microseconds",
            ),
            (
                lambda s: s.first_response,
                "inferd_first_response_duration_us",
                "Time from a request's queueing to its first response, in microseconds: decoupled "
                "models only (empty for the others)",
            ),
        )
        for histogram, name, doc in histograms:
            latency = HistogramMetricFamily(name, doc, labels=MODEL_LABELS)
            for c in counters:
                latency.add_metric(
                    [c.name, c.version], *_cumulative_buckets(histogram(c.statistics))
                )
            yield latency
        responses = CounterMetricFamily(
            "inferd_responses",
            "Responses sent by decoupled models: streamed ones and final ones that carry a "
            "response (ok or an error); 0 for other models",
            labels=MODEL_LABELS,
        )
        for c in counters:
            responses.add_metric([c.name, c.version], c.statistics.responses)
        yield responses
        yield from _ensemble_steps(counters)


def _ensemble_steps(counters: list[ModelCounters]) -> Iterator[Metric]:
    """Each ensemble step's requests and their cumulative duration (from the step's submission
    to the composing model to its answer), by outcome; an ensemble's own figures are its
    version's, above. Both families are written with no ensemble loaded, and each step's four
    series from its ensemble's load on (0 until a request runs it)."""
    labels = ("model", "version", "step", "step_model", "outcome")
    requests = CounterMetricFamily(
        "inferd_ensemble_step_requests",
        "Requests of each ensemble step, by outcome (success or fail)",
        labels=labels,
    )
    durations = CounterMetricFamily(
        "inferd_ensemble_step_duration_us",
        "Cumulative duration of each ensemble step's requests, from their submission to the "
        "composing model to its answer, by outcome, in microseconds",
        labels=labels,
    )
    for c in counters:
        for step in c.steps:
            for outcome, duration in (
                ("success", step.statistics.success),
                ("fail", step.statistics.fail),
            ):
                values = [c.name, c.version, str(step.step), step.model, outcome]
                requests.add_metric(values, duration.count)
                durations.add_metric(values, duration.ns // 1000)
    yield requests
    yield durations


def _cumulative_us(
    duration: Callable[[StatisticsSnapshot], Duration],
) -> Callable[[ModelCounters], float]:
    return lambda c: duration(c.statistics).ns // 1000


def _cumulative_buckets(histogram: LatencyHistogram) -> tuple[list[tuple[str, float]], float]:
    """The core's histogram (bounds in µs, count per bucket and one above, sum in ns) ->
    Prometheus' cumulative buckets and sum in µs."""
    counts = histogram.counts
    buckets, running = [], 0
    for bound, count in zip(histogram.bounds_us, counts, strict=False):
        running += count
        buckets.append((str(float(bound)), float(running)))
    buckets.append(("+Inf", float(running + counts[-1])))
    return buckets, histogram.sum_ns / 1000


class FailureCounts(Collector):
    """``nv_inference_request_failure`` by model, version and reason, under Triton's name (see
    CoreStatisticsCollector on why it is untyped). Counted on the event loop's thread; the copy
    taken at scrape time is one C-level dict copy, safe under the GIL. Every loaded version
    (``loaded``: its (model, version) pairs, read at scrape time) has all four reasons, at 0
    until one happens, as in Triton: a rate or an alert on them has a series from the start."""

    def __init__(self, loaded: Callable[[], Iterable[tuple[str, str]]] = tuple) -> None:
        self._loaded = loaded
        self._counts: dict[tuple[str, str, str], int] = {}
        self._sources: list[Callable[[], Iterable[tuple[str, str, ErrorCode, int]]]] = []

    def count(self, model: str, version: str, reason: str) -> None:
        key = (model, version, reason)
        self._counts[key] = self._counts.get(key, 0) + 1

    def add_source(self, source: Callable[[], Iterable[tuple[str, str, ErrorCode, int]]]) -> None:
        """Failures counted elsewhere (the core's transport), read at scrape time as
        (model, version, code, count)."""
        self._sources.append(source)

    def collect(self) -> Iterator[Metric]:
        name = "nv_inference_request_failure"
        metric = Metric(
            name, "Number of failed inference requests, all batch sizes (cumulative)", "unknown"
        )
        counts = {
            (model, version, reason): 0 for model, version in self._loaded() for reason in REASONS
        }
        for key, count in dict(self._counts).items():
            counts[key] = counts.get(key, 0) + count
        for source in self._sources:
            for model, version, code, count in source():
                key = (model, version, FAILURE_REASONS.get(code, "OTHER"))
                counts[key] = counts.get(key, 0) + count
        for (model, version, reason), value in counts.items():
            metric.add_sample(name, {"model": model, "version": version, "reason": reason}, value)
        yield metric


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


class WithoutCreated:
    """A registry's metrics less their ``*_created`` samples, which prometheus_client adds to
    its counters, histograms and summaries and which Triton does not write. Filtered here, at
    exposition, rather than with ``prometheus_client.disable_created_metrics()``, which would
    change every registry of the process (the library's switch is a module global)."""

    _CREATED_TYPES = frozenset({"counter", "histogram", "summary"})

    def __init__(self, registry: Any) -> None:  # a CollectorRegistry or a restricted view
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            if metric.type in self._CREATED_TYPES:
                created = metric.name + "_created"
                kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                kept.samples = [s for s in metric.samples if s.name != created]
                metric = kept
            yield metric

    def restricted_registry(self, names: Iterable[str]) -> WithoutCreated:
        """The same, for ``/metrics?name[]=...`` (prometheus_client's exposition calls it)."""
        return WithoutCreated(self._registry.restricted_registry(names))


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


def metrics_app(registry: CollectorRegistry) -> WSGIApplication:
    """prometheus_client's WSGI app for ``registry`` (content negotiation, gzip, ``name[]``)
    without ``*_created``, on ``/metrics`` only: it answers any path itself."""
    exposition: WSGIApplication = make_wsgi_app(WithoutCreated(registry))

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"not found: metrics are at {METRICS_PATH}\n".encode()]
        return exposition(environ, start_response)

    return app


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
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(CoreStatisticsCollector(snapshot))
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
        self._http: tuple[WSGIServer, threading.Thread] | None = None

    def failed(self, model: str, version: str, code: ErrorCode) -> None:
        self.failures.count(model, version, FAILURE_REASONS.get(code, "OTHER"))

    def load_failed(self, model: str) -> None:
        """A load of ``model`` failed (``ModelRegistry`` calls it, from any thread)."""
        self._load_failures.labels(model=model).inc()

    def serve(self, host: str, port: int) -> int:
        """Starts ``/metrics`` on a thread of its own; returns the bound port."""

        # The address family the host resolves to (IPv6 too), as start_http_server chooses it.
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, address = info[0][0], str(info[0][4][0])

        class Server(ThreadingWSGIServer):
            address_family = family

        server = make_server(
            address, port, metrics_app(self.registry), Server, handler_class=_QuietHandler
        )
        thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
        thread.start()
        self._http = (server, thread)
        return int(server.server_port)

    def close(self) -> None:
        if self._http is not None:
            server, thread = self._http
            server.shutdown()
            server.server_close()
            thread.join()
            self._http = None
