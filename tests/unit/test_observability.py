"""Telemetry without a server: spans through the in-memory exporter, trace configuration, metrics
families and run-time log settings."""

from __future__ import annotations

import asyncio
import random

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import inferd._core as _core
from inferd.core import CoreTiming
from inferd.errors import ErrorCode, InvalidArgument
from inferd.observability.logging import LogControl, apply_log_settings
from inferd.observability.metrics import InferenceMetrics
from inferd.observability.model_counters import ModelCounters
from inferd.observability.telemetry import Telemetry
from inferd.observability.tracing import (
    TRACE_SAMPLED_ATTRIBUTE,
    TRACE_SAMPLED_KEY,
    CoreSampledSampler,
    SamplingRule,
    create_tracer_provider,
    parse_trace_config,
    tracing_requested,
)

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def timing(batch_id: int, requests: int, start: int = 0) -> CoreTiming:
    now = CoreTiming.now_ns() + start
    return CoreTiming(
        now, now + 1000, now + 2000, now + 9000, now + 10000, batch_id, requests, requests, 0
    )


def traced() -> tuple[Telemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = create_tracer_provider("", environ={}, exporter=exporter)
    return Telemetry(LogControl(), None, provider), exporter


def finished(telemetry: Telemetry, exporter: InMemorySpanExporter) -> dict[str, list[object]]:
    assert telemetry.tracer_provider is not None
    telemetry.tracer_provider.force_flush()
    spans: dict[str, list[object]] = {}
    for span in exporter.get_finished_spans():
        spans.setdefault(span.name, []).append(span)
    return spans


def test_a_request_span_continues_the_caller_and_the_batch_links_every_request() -> None:
    telemetry, exporter = traced()
    metadata = [("traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")]
    batch = timing(7, 3)
    for _ in range(3):
        with telemetry.request("m", metadata) as observed:
            observed.resolved("m", "2")
            observed.computed(batch)
    spans = finished(telemetry, exporter)
    requests = spans["ModelInfer"]
    assert len(requests) == 3
    for span in requests:
        assert format(span.context.trace_id, "032x") == CALLER_TRACE  # type: ignore[attr-defined]
        assert format(span.parent.span_id, "016x") == CALLER_SPAN  # type: ignore[attr-defined]
        assert span.attributes["inferd.batch_id"] == 7  # type: ignore[attr-defined]
    (batch_span,) = spans["batch"]
    linked = {link.context.span_id for link in batch_span.links}  # type: ignore[attr-defined]
    assert linked == {s.context.span_id for s in requests}  # type: ignore[attr-defined]
    assert batch_span.attributes["inferd.batch_requests"] == 3  # type: ignore[attr-defined]
    assert batch_span.start_time == CoreTiming.wall_ns(batch.compute_start)  # type: ignore[attr-defined]
    assert {s.name for s in exporter.get_finished_spans()} >= {"queue", "compute"}


def test_a_batch_waits_for_all_its_requests_and_a_failed_request_is_an_error_span() -> None:
    telemetry, exporter = traced()
    with telemetry.request("m", None) as observed:
        observed.resolved("m", "1")
        observed.computed(timing(1, 2))
    assert "batch" not in finished(telemetry, exporter)  # one of its two requests is missing
    with pytest.raises(InvalidArgument), telemetry.request("m", None) as observed:
        raise InvalidArgument("bad input")
    (failed,) = [s for s in finished(telemetry, exporter)["ModelInfer"] if not s.status.is_ok]  # type: ignore[attr-defined]
    assert "INVALID_ARGUMENT" in failed.status.description  # type: ignore[attr-defined]
    assert failed.parent is None  # type: ignore[attr-defined]  # no traceparent: a new trace


def test_tracing_is_off_unless_configured() -> None:
    assert not tracing_requested({}, {})
    assert tracing_requested({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"})
    assert tracing_requested({}, {"OTEL_TRACES_EXPORTER": "otlp"})
    assert not tracing_requested({"endpoint": "x:1"}, {"OTEL_SDK_DISABLED": "true"})
    assert tracing_requested(parse_trace_config("endpoint=127.0.0.1:4317"), {})
    assert create_tracer_provider("", environ={}) is None
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_trace_config("rate=0.5")
    with pytest.raises(ValueError, match="unknown sampler"):
        create_tracer_provider("endpoint=127.0.0.1:1,sampler=sometimes", environ={})


SAMPLERS = [
    ("always_on", "", SamplingRule(False, 1.0)),
    ("always_off", "", SamplingRule(False, 0.0)),
    ("traceidratio", "0.3", SamplingRule(False, 0.3)),
    ("parentbased_always_on", "", SamplingRule(True, 1.0)),
    ("parentbased_always_off", "", SamplingRule(True, 0.0)),
    ("parentbased_traceidratio", "0.3", SamplingRule(True, 0.3)),
]


def core_rule(provider: object) -> SamplingRule | None:
    sampler = getattr(provider, "sampler", None)
    assert isinstance(sampler, CoreSampledSampler)
    return sampler.rule


@pytest.mark.parametrize(("name", "argument", "rule"), SAMPLERS)
def test_the_cores_sampling_decides_as_the_configured_opentelemetry_sampler(
    name: str, argument: str, rule: SamplingRule
) -> None:
    """Every request with a caller's traceparent gets the same decision from the core's rule as
    from OpenTelemetry's own sampler (ratio samplers compare the trace id: no draw)."""
    config = f"sampler={name}" + (f",sampler_arg={argument}" if argument else "")
    provider = create_tracer_provider(config, environ={}, exporter=InMemorySpanExporter())
    assert provider is not None and core_rule(provider) == rule
    sampler = provider.sampler
    assert isinstance(sampler, CoreSampledSampler)
    core = _core.TraceSampling(True, rule.parent_based, rule.ratio)
    propagator = TraceContextTextMapPropagator()
    generator = random.Random(7)
    decisions = {True: 0, False: 0}
    for i in range(2000):
        trace_id = generator.getrandbits(128) or 1
        header = f"00-{trace_id:032x}-{generator.getrandbits(64) or 1:016x}-0{i % 2}"
        parent = propagator.extract({"traceparent": header})
        assert get_current_span(parent).get_span_context().trace_id == trace_id
        otel = sampler.inner.should_sample(parent, trace_id, "ModelInfer").decision
        expected = otel == Decision.RECORD_AND_SAMPLE
        assert core.traced(header) == expected, (name, header)
        decisions[expected] += 1
    if rule.ratio not in (0.0, 1.0):
        assert decisions[True] and decisions[False]  # both outcomes were compared
    # A request that starts a trace: fixed for always_on/always_off roots.
    if rule.ratio in (0.0, 1.0):
        assert core.traced("") == (rule.ratio == 1.0)
        assert core.traced("not a traceparent") == (rule.ratio == 1.0)
    assert not _core.TraceSampling().traced(header)  # tracing off


def test_the_sampler_comes_from_the_environment_as_the_sdk_reads_it() -> None:
    def rule(environ: dict[str, str]) -> SamplingRule | None:
        return core_rule(
            create_tracer_provider("", environ=environ, exporter=InMemorySpanExporter())
        )

    assert rule({}) == SamplingRule(True, 1.0)  # the SDK's default: parentbased_always_on
    ratio = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    assert rule(ratio) == SamplingRule(False, 0.25)
    assert rule({"OTEL_TRACES_SAMPLER": "sometimes"}) == SamplingRule(True, 1.0)
    unreadable = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "x"}
    assert rule(unreadable) == SamplingRule(True, 1.0)
    # --trace-config wins over the environment.
    provider = create_tracer_provider(
        "sampler=always_off", environ=ratio, exporter=InMemorySpanExporter()
    )
    assert core_rule(provider) == SamplingRule(False, 0.0)


def test_a_request_the_core_sampled_is_recorded_whatever_the_sampler_would_draw() -> None:
    exporter = InMemorySpanExporter()
    provider = create_tracer_provider("sampler=always_off", environ={}, exporter=exporter)
    assert provider is not None
    telemetry = Telemetry(LogControl(), None, provider)
    unsampled = f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"
    for metadata in (
        [("traceparent", unsampled)],
        [(TRACE_SAMPLED_KEY, "0")],
        [(TRACE_SAMPLED_KEY, "1"), ("traceparent", unsampled)],
        [(TRACE_SAMPLED_KEY, "1")],
    ):
        with telemetry.request("m", metadata) as observed:
            observed.resolved("m", "1")
            observed.computed(timing(1, 1))
    spans = finished(telemetry, exporter)["ModelInfer"]
    assert len(spans) == 2  # the two the core marked
    caller = [s for s in spans if s.parent is not None]  # type: ignore[attr-defined]
    assert len(caller) == 1 and f"{caller[0].context.trace_id:032x}" == CALLER_TRACE  # type: ignore[attr-defined]
    for span in spans:
        assert TRACE_SAMPLED_ATTRIBUTE not in span.attributes  # type: ignore[attr-defined]
        assert span.attributes["inferd.model"] == "m"  # type: ignore[attr-defined]
    # Unmarked, the inner sampler decides.
    sampler = CoreSampledSampler(ALWAYS_OFF, SamplingRule(False, 0.0))
    assert sampler.should_sample(None, 1, "x").decision == Decision.DROP
    marked = sampler.should_sample(None, 1, "x", attributes={TRACE_SAMPLED_ATTRIBUTE: True, "a": 1})
    assert marked.decision == Decision.RECORD_AND_SAMPLE and dict(marked.attributes) == {"a": 1}


def test_without_tracing_or_verbose_logs_a_request_costs_no_telemetry_object() -> None:
    telemetry = Telemetry(LogControl())
    assert not telemetry.observes_each_request
    with telemetry.request("m", [("traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")]) as o:
        o.resolved("m", "1")
        o.computed(timing(1, 1))
    verbose = Telemetry(LogControl(verbose=1))
    assert verbose.observes_each_request
    traced_telemetry, _ = traced()
    assert traced_telemetry.observes_each_request


def test_metrics_expose_triton_names_and_failure_reasons() -> None:
    one = _core.Duration(1, 1)
    batch = _core.BatchDurations(one, one, one)
    # The core's histograms: a count per bound (100, 250, 500, 1000 µs, ...) and one above all.
    above_all = len(_core.LatencyHistogram().bounds_us)
    statistics = _core.StatisticsSnapshot(
        success=_core.Duration(5, 5_000_000),
        queue=_core.Duration(5, 1_000_000),
        compute_input=_core.Duration(2, 10_000),
        compute_infer=_core.Duration(2, 3_000_000),
        compute_output=_core.Duration(2, 20_000),
        inference_count=9,
        execution_count=2,
        batches={4: batch, 5: batch},
        request_duration=_core.LatencyHistogram(
            [1, 0, 0, 3] + [0] * (above_all - 4) + [1], 9_000_000
        ),
        queue_duration=_core.LatencyHistogram([5] + [0] * above_all, 250_000),
    )
    metrics = InferenceMetrics(lambda: [ModelCounters("m", "1", statistics, 3)], gpu=False)
    metrics.failed("m", "1", ErrorCode.RESOURCE_EXHAUSTED)
    metrics.failed("m", "1", ErrorCode.INVALID_ARGUMENT)
    text = generate_latest(metrics.registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    model = (("model", "m"), ("version", "1"))
    assert samples[("nv_inference_request_success", model)] == 5
    assert samples[("nv_inference_count", model)] == 9
    assert samples[("nv_inference_exec_count", model)] == 2
    assert samples[("nv_inference_compute_infer_duration_us", model)] == 3000
    assert samples[("nv_inference_pending_request_count", model)] == 3
    assert samples[("inferd_batch_size_count", model)] == 2
    assert samples[("inferd_batch_size_sum", model)] == 9
    assert samples[("inferd_batch_size_bucket", (("le", "4.0"), *model))] == 1
    for reason in ("REJECTED", "OTHER"):
        key = ("nv_inference_request_failure", tuple(sorted((*model, ("reason", reason)))))
        assert samples[key] == 1
    assert samples[("inferd_request_duration_us_count", model)] == 5
    assert samples[("inferd_request_duration_us_sum", model)] == 9000
    assert samples[("inferd_request_duration_us_bucket", (("le", "100.0"), *model))] == 1
    assert samples[("inferd_request_duration_us_bucket", (("le", "1000.0"), *model))] == 4
    assert samples[("inferd_queue_duration_us_bucket", (("le", "100.0"), *model))] == 5


def test_log_settings_follow_tritons_keys() -> None:
    control = LogControl()
    settings = apply_log_settings(control, {"log_verbose_level": 2, "log_info": False})
    assert settings["log_verbose_level"] == 2 and settings["log_info"] is False
    assert control.level == "warning" and not control.admits("info")
    apply_log_settings(control, {"log_warning": False, "log_error": False})
    assert control.level == "critical"
    apply_log_settings(control, {"log_info": True})
    assert control.level == "info"
    bad_values: list[dict[str, object]] = [
        {"log_info": 1},
        {"log_verbose_level": True},  # a bool is an int to Python, not a verbose level
        {"log_verbose_level": 1.5},
        {"log_file": "/tmp/x"},
        {"log_format": "ISO8601"},
        {"x": 1},
    ]
    for bad in bad_values:
        with pytest.raises(InvalidArgument):
            apply_log_settings(control, bad)


def test_telemetry_inside_a_task_restores_the_outer_context() -> None:
    telemetry, exporter = traced()

    async def request() -> None:
        with telemetry.request("m", None):
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(request(), request())

    asyncio.run(main())
    assert len(finished(telemetry, exporter)["ModelInfer"]) == 2


def test_records_inside_a_request_carry_the_trace_ids() -> None:
    from inferd.observability.logging import _add_trace_ids

    metadata = [("traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")]
    untraced = Telemetry(LogControl())
    with untraced.request("m", metadata):
        record = _add_trace_ids(None, "info", {"event": "x"})
    assert record["trace_id"] == CALLER_TRACE and record["parent_span_id"] == CALLER_SPAN
    assert "trace_id" not in _add_trace_ids(None, "info", {"event": "outside"})
    telemetry, _ = traced()
    with telemetry.request("m", metadata):
        record = _add_trace_ids(None, "info", {"event": "x"})
    assert record["trace_id"] == CALLER_TRACE and record["span_id"] != CALLER_SPAN


@pytest.mark.parametrize(
    "traceparent",
    [
        '00-{"level": "critical"}-forged-01',  # three dashes, not hex: the old check took it
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\nlevel=critical",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # the invalid trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # the invalid span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # the invalid version
        "00-" + "a" * 600 + "-00f067aa0ba902b7-01",
    ],
)
def test_an_invalid_traceparent_never_reaches_a_log_record(traceparent: str) -> None:
    from inferd.observability.logging import _add_trace_ids, caller_trace_id

    metadata = [("traceparent", traceparent)]
    assert caller_trace_id(metadata) is None
    with Telemetry(LogControl()).request("m", metadata):
        record = _add_trace_ids(None, "info", {"event": "x"})
    assert "trace_id" not in record and "parent_span_id" not in record


def test_a_later_versions_traceparent_gives_its_ids() -> None:
    from inferd.observability.logging import caller_trace_id

    later = f" 01-{CALLER_TRACE}-{CALLER_SPAN}-01-what-comes-later "
    assert caller_trace_id([("traceparent", later)]) == CALLER_TRACE
