"""An ensemble's request observed without a server (issue 16, item 3): its ``ensemble`` span
with a ``step`` per step, each linked from the batch of the composing model it rode in, and the
per-step metric families. The core's step timings cannot be built from Python: the fakes here
carry the attributes ``RequestTiming.steps`` gives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import inferd._core as _core
from inferd.core import CoreTiming
from inferd.observability.logging import LogControl
from inferd.observability.metrics import InferenceMetrics
from inferd.observability.model_counters import EnsembleStepCounters, ModelCounters
from inferd.observability.telemetry import Telemetry
from inferd.observability.tracing import create_tracer_provider

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SAMPLED = [("traceparent", f"00-{CALLER_TRACE}-00f067aa0ba902b7-01")]
NOT_SAMPLED = [("traceparent", f"00-{CALLER_TRACE}-00f067aa0ba902b7-00")]


def step_request(start: int, batch_id: int, requests: int) -> CoreTiming:
    """A step's request, queued at ``start`` (core ns), computed 1-2 µs later in batch
    ``batch_id`` of ``requests`` requests."""
    return CoreTiming(
        start, start + 1000, start + 1200, start + 1800, start + 2000, batch_id, requests, 2, 0
    )


@dataclass(frozen=True)
class FakeStepTiming:
    """What ``_core.EnsembleStepTiming`` carries."""

    step: int
    model: str
    version: int
    submitted: int
    answered: int
    timing: CoreTiming


@dataclass(frozen=True)
class FakeEnsembleTiming:
    """An ensemble request's ``RequestTiming`` as the core gives it: its run from ``enqueued``
    to ``compute_end``, no batch of its own (0: did not happen), and its finished steps."""

    enqueued: int
    compute_end: int
    steps: list[FakeStepTiming] = field(default_factory=list)
    compute_start: int = 0
    input_done: int = 0
    infer_done: int = 0
    batch_id: int = 0
    batch_requests: int = 0
    batch_rows: int = 0
    instance: int = 0


def ensemble_timing(start: int, shared_batch: int) -> CoreTiming:
    """A chain pre -> left -> right; ``left`` rides batch ``shared_batch`` with one other request
    (each other step alone in its batch)."""
    steps = [
        FakeStepTiming(0, "pre", 1, start + 100, start + 2500, step_request(start + 200, 1, 1)),
        FakeStepTiming(
            1, "left", 3, start + 2600, start + 5000, step_request(start + 2700, shared_batch, 2)
        ),
        FakeStepTiming(2, "right", 1, start + 5100, start + 7500, step_request(start + 5200, 4, 1)),
    ]
    return cast(CoreTiming, FakeEnsembleTiming(start, start + 7600, steps))


def traced() -> tuple[Telemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = create_tracer_provider("", environ={}, exporter=exporter)
    return Telemetry(LogControl(), None, provider), exporter


def finished(telemetry: Telemetry, exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    assert telemetry.tracer_provider is not None
    telemetry.tracer_provider.force_flush()
    return list(exporter.get_finished_spans())


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == span_id(parent)]


def test_an_ensemble_request_has_an_ensemble_span_with_a_step_per_step_linked_to_its_batch() -> (
    None
):
    telemetry, exporter = traced()
    start = CoreTiming.now_ns()
    timing = ensemble_timing(start, shared_batch=9)
    with telemetry.request("chain", SAMPLED) as observed:
        observed.resolved("chain", "1")
        observed.computed(timing)
    # A direct request to left, in the same batch as the ensemble's left step.
    with telemetry.request("left", SAMPLED) as observed:
        observed.resolved("left", "3")
        observed.computed(step_request(start + 2700, 9, 2))
    spans = finished(telemetry, exporter)
    request = next(s for s in named(spans, "ModelInfer") if s.attributes["inferd.model"] == "chain")  # type: ignore[index]
    assert request.attributes is not None and request.attributes["inferd.model_version"] == "1"
    assert "inferd.batch_id" not in request.attributes  # an ensemble rides no batch itself
    (ensemble,) = children(spans, request)
    assert ensemble.name == "ensemble"
    assert dict(ensemble.attributes or {}) == {
        "inferd.model": "chain",
        "inferd.model_version": "1",
        "inferd.ensemble_steps": 3,
    }
    assert ensemble.start_time == CoreTiming.wall_ns(start)
    assert ensemble.end_time == CoreTiming.wall_ns(start + 7600)
    steps = sorted(children(spans, ensemble), key=lambda s: s.start_time or 0)
    assert [s.name for s in steps] == ["step"] * 3
    expected = [(0, "pre", "1", 1), (1, "left", "3", 9), (2, "right", "1", 4)]
    batches = named(spans, "batch")
    for step, (index, model, version, batch_id), fake in zip(
        steps, expected, cast(Any, timing).steps, strict=True
    ):
        attributes = step.attributes or {}
        assert (
            attributes["inferd.step"],
            attributes["inferd.model"],
            attributes["inferd.model_version"],
            attributes["inferd.batch_id"],
        ) == (index, model, version, batch_id)
        assert step.start_time == CoreTiming.wall_ns(fake.submitted)
        assert step.end_time == CoreTiming.wall_ns(fake.answered)
        queue, compute = sorted(children(spans, step), key=lambda s: s.start_time or 0)
        assert (queue.name, compute.name) == ("queue", "compute")
        assert compute.start_time == CoreTiming.wall_ns(fake.timing.compute_start)
        (batch,) = [b for b in batches if span_id(step) in {lk.context.span_id for lk in b.links}]
        assert batch.attributes is not None
        assert (batch.attributes["inferd.model"], batch.attributes["inferd.model_version"]) == (
            model,
            version,
        )
        assert batch.attributes["inferd.batch_id"] == batch_id
    # left's batch links the step and the direct request that shared it.
    (shared,) = [b for b in batches if (b.attributes or {}).get("inferd.batch_id") == 9]
    direct = next(s for s in named(spans, "ModelInfer") if s.attributes["inferd.model"] == "left")  # type: ignore[index]
    assert {lk.context.span_id for lk in shared.links} == {span_id(steps[1]), span_id(direct)}
    assert len(batches) == 3


def test_an_unsampled_ensemble_request_records_no_span_but_completes_its_steps_batches() -> None:
    telemetry, exporter = traced()
    start = CoreTiming.now_ns()
    with telemetry.request("chain", NOT_SAMPLED) as observed:
        observed.resolved("chain", "1")
        observed.computed(ensemble_timing(start, shared_batch=9))
    with telemetry.request("left", SAMPLED) as observed:
        observed.resolved("left", "3")
        observed.computed(step_request(start + 2700, 9, 2))
    spans = finished(telemetry, exporter)
    assert not named(spans, "ensemble") and not named(spans, "step")
    # The batch both rode in is complete (both reported) and links the sampled request only.
    (batch,) = named(spans, "batch")
    (direct,) = named(spans, "ModelInfer")
    assert [lk.context.span_id for lk in batch.links] == [span_id(direct)]


def metric_samples(
    metrics: InferenceMetrics,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


class FakeStepStatistics:
    """What ``_core.EnsembleStepStatistics`` carries."""

    def __init__(self, success: _core.Duration, fail: _core.Duration) -> None:
        self.success = success
        self.fail = fail


def test_each_ensemble_step_has_its_requests_and_durations_by_outcome() -> None:
    ensemble_statistics = _core.StatisticsSnapshot(success=_core.Duration(5, 9_000_000))
    steps = (
        EnsembleStepCounters(
            0,
            "pre",
            cast(
                _core.EnsembleStepStatistics,
                FakeStepStatistics(_core.Duration(5, 2_000_000), _core.Duration(1, 7_000)),
            ),
        ),
        EnsembleStepCounters(
            1,
            "left",
            cast(
                _core.EnsembleStepStatistics,
                FakeStepStatistics(_core.Duration(4, 3_000_000), _core.Duration()),
            ),
        ),
    )
    model = _core.StatisticsSnapshot(success=_core.Duration(3, 1_000_000))
    metrics = InferenceMetrics(
        lambda: [
            ModelCounters("chain", "1", ensemble_statistics, 0, steps),
            ModelCounters("pre", "1", model, 0),
        ],
        gpu=False,
    )
    samples = metric_samples(metrics)

    def step(index: str, step_model: str, outcome: str) -> tuple[tuple[str, str], ...]:
        labels = {"model": "chain", "version": "1", "step": index, "step_model": step_model}
        return tuple(sorted({**labels, "outcome": outcome}.items()))

    requests, durations = (
        "inferd_ensemble_step_requests_total",
        "inferd_ensemble_step_duration_us_total",
    )
    assert samples[(requests, step("0", "pre", "success"))] == 5
    assert samples[(requests, step("0", "pre", "fail"))] == 1
    assert samples[(durations, step("0", "pre", "success"))] == 2000
    assert samples[(durations, step("0", "pre", "fail"))] == 7
    assert samples[(requests, step("1", "left", "success"))] == 4
    assert samples[(requests, step("1", "left", "fail"))] == 0  # there from the load
    # Only the ensemble's steps: a plain model has none; the ensemble's own figures are a model's.
    step_series = [key for key in samples if key[0] in (requests, durations)]
    assert len(step_series) == 8
    assert samples[("nv_inference_request_success", (("model", "chain"), ("version", "1")))] == 5
    assert not any(name.endswith("_created") for name, _ in samples)


def test_the_step_families_are_there_with_no_ensemble_loaded() -> None:
    metrics = InferenceMetrics(list, gpu=False)
    text = generate_latest(metrics.registry).decode()
    families = {family.name for family in text_string_to_metric_families(text)}
    assert {"inferd_ensemble_step_requests", "inferd_ensemble_step_duration_us"} <= families
