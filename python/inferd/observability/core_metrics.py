"""Triton's per-version families, read from the core's counters at scrape time: the same
counters ``ModelStatistics`` answers with, so the two never disagree; so are the latency,
queue-time and batch-size histograms, which the core keeps."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from inferd._core import Duration, LatencyHistogram, StatisticsSnapshot
    from inferd.observability.model_counters import ModelCounters

MODEL_LABELS = ("model", "version")

# Triton's cumulative durations: what each reads of a version's statistics, its name, its help.
_DURATIONS: tuple[tuple[Callable[[StatisticsSnapshot], Duration], str, str], ...] = (
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
# The core's latency histograms, likewise.
_HISTOGRAMS: tuple[tuple[Callable[[StatisticsSnapshot], LatencyHistogram], str, str], ...] = (
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


class CoreStatisticsCollector(Collector):
    """Triton's counters, read from the core at scrape time. ``snapshot`` runs on the HTTP
    server's thread: it must only read (the registry gives it an immutable tuple)."""

    def __init__(
        self, snapshot: Callable[[], list[ModelCounters]], *, caching: bool = False
    ) -> None:
        self._snapshot = snapshot
        # The server has a response cache: Triton's per-model cache families are written.
        self._caching = caching

    def collect(self) -> Iterator[Metric]:
        counters = self._snapshot()
        yield from _request_counters(counters)
        yield from _queue_and_batch_sizes(counters)
        yield from _latency_histograms(counters)
        yield _responses(counters)
        yield from _sequences(counters)
        yield from _ensemble_steps(counters)
        if self._caching:
            yield from _cache_counters(counters)


def _untyped_counter(
    counters: list[ModelCounters], name: str, doc: str, value: Callable[[ModelCounters], float]
) -> Metric:
    # Triton's exact names, which carry no _total suffix, so that dashboards and alerts built
    # for Triton work unchanged. prometheus-client writes a counter only with _total, so these
    # go out untyped; each is cumulative and never goes down.
    metric = Metric(name, f"{doc} (cumulative)", "unknown")
    for c in counters:
        metric.add_sample(name, {"model": c.name, "version": c.version}, value(c))
    return metric


def _request_counters(counters: list[ModelCounters]) -> Iterator[Metric]:
    """Requests, inferences and executions, then the cumulative durations, under Triton's
    names."""
    yield _untyped_counter(
        counters,
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        lambda c: c.statistics.success.count,
    )
    yield _untyped_counter(
        counters,
        "nv_inference_count",
        "Number of inferences performed (rows: a batch of 4 counts 4)",
        lambda c: c.statistics.inference_count,
    )
    yield _untyped_counter(
        counters,
        "nv_inference_exec_count",
        "Number of model executions performed (batches)",
        lambda c: c.statistics.execution_count,
    )
    for duration, name, doc in _DURATIONS:
        yield _untyped_counter(counters, name, f"{doc} in microseconds", _cumulative_us(duration))


def _queue_and_batch_sizes(counters: list[ModelCounters]) -> Iterator[Metric]:
    """Each version's queue depth now, and the sizes of the batches it has executed."""
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


def _latency_histograms(counters: list[ModelCounters]) -> Iterator[Metric]:
    for histogram, name, doc in _HISTOGRAMS:
        latency = HistogramMetricFamily(name, doc, labels=MODEL_LABELS)
        for c in counters:
            latency.add_metric([c.name, c.version], *_cumulative_buckets(histogram(c.statistics)))
        yield latency


def _responses(counters: list[ModelCounters]) -> Metric:
    responses = CounterMetricFamily(
        "inferd_responses",
        "Responses sent by decoupled models: streamed ones and final ones that carry a "
        "response (ok or an error); 0 for other models",
        labels=MODEL_LABELS,
    )
    for c in counters:
        responses.add_metric([c.name, c.version], c.statistics.responses)
    return responses


def _sequences(counters: list[ModelCounters]) -> Iterator[Metric]:
    """A stateful model's sequences (sequence_batching): those holding a batch slot or
    candidacy, those waiting for one, and those ended for being idle past
    max_sequence_idle_microseconds. Only models with sequence batching have samples."""
    active = GaugeMetricFamily(
        "inferd_sequences_active",
        "Sequences of a stateful model holding a place (a direct slot, an oldest candidacy)",
        labels=MODEL_LABELS,
    )
    backlog = GaugeMetricFamily(
        "inferd_sequences_backlog",
        "Sequences of a stateful model waiting for a place",
        labels=MODEL_LABELS,
    )
    idle = CounterMetricFamily(
        "inferd_sequences_idle_ended",
        "Sequences ended by the server for being idle past max_sequence_idle_microseconds",
        labels=MODEL_LABELS,
    )
    for c in counters:
        if c.sequences is None:
            continue
        labels = [c.name, c.version]
        active.add_metric(labels, c.sequences[0])
        backlog.add_metric(labels, c.sequences[1])
        idle.add_metric(labels, c.sequences[2])
    yield active
    yield backlog
    yield idle


def _cache_counters(counters: list[ModelCounters]) -> Iterator[Metric]:
    """Triton's response cache families, per model version: hits and misses, and the time
    spent answering hits and looking up and inserting misses, in microseconds (0 for a model
    whose config does not enable response_cache)."""
    yield _untyped_counter(
        counters,
        "nv_cache_num_hits_per_model",
        "Number of response cache hits per model",
        lambda c: c.statistics.cache_hit.count,
    )
    yield _untyped_counter(
        counters,
        "nv_cache_num_misses_per_model",
        "Number of response cache misses per model",
        lambda c: c.statistics.cache_miss.count,
    )
    yield _untyped_counter(
        counters,
        "nv_cache_hit_duration_per_model",
        "Total time answering requests from the response cache per model, in microseconds",
        lambda c: c.statistics.cache_hit.ns // 1000,
    )
    yield _untyped_counter(
        counters,
        "nv_cache_miss_duration_per_model",
        "Total time of response cache lookups that missed and of their answers' inserts per "
        "model, in microseconds",
        lambda c: c.statistics.cache_miss.ns // 1000,
    )


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
