"""Triton's trace settings over the OpenTelemetry sampler: defaults read from the configured
sampler, updates global and per model, clearing, the trace budget, and refusals (the served call,
over the core's transport, is tested in tests/integration/test_trace_settings.py)."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferd.errors import ErrorCode, InferdError
from inferd.observability.trace_settings import TraceSettings
from inferd.observability.tracing import (
    MODEL_ATTRIBUTE,
    REQUEST_SPAN,
    TRACE_SAMPLED_ATTRIBUTE,
    CoreSampledSampler,
    SamplingRule,
    create_tracer_provider,
)


def configured(config: str) -> tuple[TraceSettings, TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = create_tracer_provider(config, environ={}, exporter=exporter)
    assert provider is not None
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # at once: the tests count spans
    assert isinstance(provider.sampler, CoreSampledSampler)
    return TraceSettings(provider.sampler), provider, exporter


def defaults(level: str = "TIMESTAMPS", rate: str = "1", count: str = "-1") -> dict[str, list[str]]:
    return {
        "trace_level": [level],
        "trace_rate": [rate],
        "trace_count": [count],
        "trace_mode": ["opentelemetry"],
    }


def requests(provider: TracerProvider, model: str, count: int, **extra: object) -> int:
    """Starts ``count`` request spans of ``model`` as Python's own (not the core's) and returns
    how many were sampled."""
    tracer = provider.get_tracer("test")
    sampled = 0
    for _ in range(count):
        span = tracer.start_span(REQUEST_SPAN, attributes={MODEL_ATTRIBUTE: model, **extra})
        sampled += span.get_span_context().trace_flags.sampled
        span.end()
    return sampled


def test_the_defaults_are_the_configured_samplers() -> None:
    assert configured("sampler=parentbased_always_on")[0].current() == defaults()
    assert configured("sampler=traceidratio,sampler_arg=0.1")[0].current() == defaults(rate="10")
    assert configured("sampler=always_off")[0].current() == defaults(rate="0")
    # A model without settings of its own reads the global ones.
    assert configured("sampler=traceidratio,sampler_arg=0.25")[0].current("simple") == defaults(
        rate="4"
    )
    # Tracing off: read as OFF, and it cannot be turned on without an exporter.
    off = TraceSettings(None)
    assert off.current() == defaults(level="OFF", rate="0")
    with pytest.raises(InferdError) as refused:
        off.update("", {"trace_level": ["TIMESTAMPS"]})
    assert refused.value.code is ErrorCode.FAILED_PRECONDITION
    assert "--trace-config endpoint=" in str(refused.value)


def test_the_rate_becomes_the_samplers_ratio_and_the_parent_rule_stays() -> None:
    settings, provider, _ = configured("sampler=parentbased_traceidratio,sampler_arg=0.5")
    assert settings.update("", {"trace_rate": ["4"]}) == defaults(rate="4")
    sampler = provider.sampler
    assert isinstance(sampler, CoreSampledSampler)
    assert sampler.rule == SamplingRule(parent_based=True, ratio=0.25)
    assert "ParentBased" in sampler.inner.get_description()
    assert "0.25" in sampler.inner.get_description()
    assert settings.update("", {"trace_rate": ["0"]}) == defaults(rate="0")
    assert sampler.rule == SamplingRule(parent_based=True, ratio=0.0)
    # Cleared: back to the configured ratio, not to its rounding.
    assert settings.update("", {"trace_rate": []}) == defaults(rate="2")
    assert sampler.rule == SamplingRule(parent_based=True, ratio=0.5)


def test_level_off_samples_nothing_not_even_a_sampled_parent() -> None:
    settings, provider, exporter = configured("sampler=parentbased_always_on")
    assert settings.update("", {"trace_level": ["OFF"]}) == defaults(level="OFF")
    assert settings.rule() == SamplingRule(parent_based=False, ratio=0.0)
    assert settings.rule().samples_nothing
    parent = trace.set_span_in_context(
        trace.NonRecordingSpan(
            trace.SpanContext(1, 2, is_remote=True, trace_flags=trace.TraceFlags(1))
        )
    )
    span = provider.get_tracer("test").start_span(REQUEST_SPAN, context=parent)
    assert not span.is_recording()
    assert requests(provider, "simple", 10) == 0
    assert exporter.get_finished_spans() == ()
    assert settings.update("", {"trace_level": ["TIMESTAMPS", "TIMESTAMPS"]}) == defaults()
    assert requests(provider, "simple", 10) == 10


def test_the_count_is_a_budget_of_traces_and_reads_back_what_is_left() -> None:
    settings, provider, _ = configured("sampler=always_on")
    assert settings.update("", {"trace_count": ["3"]}) == defaults(count="3")
    assert requests(provider, "simple", 10) == 3
    assert settings.current()["trace_count"] == ["0"]
    # The budget is the core's too: a republished snapshot shares the same one.
    budget = settings.rule().budget
    assert budget is not None and budget.remaining == 0
    assert settings.update("", {"trace_count": ["-1"]}) == defaults()
    assert settings.rule().budget is None
    assert requests(provider, "simple", 5) == 5


def test_a_child_of_a_recorded_span_is_recorded_and_takes_no_trace() -> None:
    settings, provider, exporter = configured("sampler=traceidratio,sampler_arg=1.0")
    settings.update("", {"trace_count": ["1"]})
    tracer = provider.get_tracer("test")
    span = tracer.start_span(REQUEST_SPAN, attributes={MODEL_ATTRIBUTE: "simple"})
    child = tracer.start_span("queue", context=trace.set_span_in_context(span))
    assert span.is_recording() and child.is_recording()
    child.end()
    span.end()
    assert settings.current()["trace_count"] == ["0"]
    assert [s.name for s in exporter.get_finished_spans()] == ["queue", REQUEST_SPAN]


def test_a_models_settings_override_the_global_ones_until_cleared() -> None:
    # As Triton's trace_endpoint_test: the model's own values stay, the others follow the global.
    settings, provider, _ = configured("sampler=parentbased_always_on")
    assert settings.update("simple", {"trace_rate": ["12"]}) == defaults(rate="12")
    assert settings.update("", {"trace_rate": ["56"], "trace_level": ["OFF"]}) == defaults(
        level="OFF", rate="56"
    )
    assert settings.current("simple") == defaults(level="OFF", rate="12")
    assert settings.update("simple", {"trace_level": ["TIMESTAMPS"]}) == defaults(rate="12")
    sampler = provider.sampler
    assert isinstance(sampler, CoreSampledSampler)
    assert sampler.rule == SamplingRule(parent_based=False, ratio=0.0)
    assert sampler.model_rules == {"simple": SamplingRule(parent_based=True, ratio=1 / 12)}
    # Python's sampler decides a model's requests by its rule, the others by the global one.
    settings.update("simple", {"trace_rate": ["1"]})
    assert requests(provider, "simple", 5) == 5
    assert requests(provider, "other", 5) == 0
    # A count of the model's own is its budget alone; without one it shares the global budget.
    settings.update("simple", {"trace_count": ["2"]})
    assert requests(provider, "simple", 5) == 2
    assert settings.current()["trace_count"] == ["-1"]
    # Cleared one by one: back to the global values, and the model has no rule of its own left.
    settings.update("simple", {"trace_count": [], "trace_rate": []})
    assert settings.current("simple") == defaults(rate="56")
    assert settings.update("simple", {"trace_level": []}) == defaults(level="OFF", rate="56")
    assert sampler.model_rules == {}
    # A global clear goes back to the value at start.
    assert settings.update("", {"trace_level": [], "trace_rate": []}) == defaults()
    assert settings.current("simple") == defaults()


def test_a_request_the_core_sampled_is_recorded_whatever_the_settings() -> None:
    settings, provider, _ = configured("sampler=parentbased_always_on")
    settings.update("", {"trace_level": ["OFF"]})
    assert requests(provider, "simple", 3, **{TRACE_SAMPLED_ATTRIBUTE: True}) == 3


@pytest.mark.parametrize(
    ("changes", "code", "message"),
    [
        (
            {"trace_levels": ["OFF"]},
            ErrorCode.INVALID_ARGUMENT,
            "unknown trace setting 'trace_levels'",
        ),
        (
            {"trace_file": ["/tmp/t.json"]},
            ErrorCode.UNIMPLEMENTED,
            "trace file location can not be updated through network protocol",
        ),
        (
            {"trace_level": ["OFF", "TIMESTAMPS"]},
            ErrorCode.INVALID_ARGUMENT,
            "Expect only one trace level 'OFF' is specified",
        ),
        ({"trace_level": ["TENSORS"]}, ErrorCode.INVALID_ARGUMENT, "'TENSORS' is not supported"),
        ({"trace_level": ["LOUD"]}, ErrorCode.INVALID_ARGUMENT, "unknown trace level 'LOUD'"),
        (
            {"trace_rate": ["ten"]},
            ErrorCode.INVALID_ARGUMENT,
            "Unable to parse 'trace_rate', got: ten",
        ),
        (
            {"trace_rate": ["-1"]},
            ErrorCode.INVALID_ARGUMENT,
            "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: -1",
        ),
        (
            {"trace_rate": ["4294967296"]},
            ErrorCode.INVALID_ARGUMENT,
            "value is out of range [ 0, 4294967295 ]",
        ),
        (
            {"trace_rate": ["1", "2"]},
            ErrorCode.INVALID_ARGUMENT,
            "expect only 1 value for 'trace_rate'",
        ),
        (
            {"trace_count": ["-2"]},
            ErrorCode.INVALID_ARGUMENT,
            "Unable to parse 'trace_count'. Expecting value >= -1, got: -2",
        ),
        ({"log_frequency": ["1.5"]}, ErrorCode.INVALID_ARGUMENT, "Unable to parse 'log_frequency'"),
        ({"trace_mode": ["triton"]}, ErrorCode.INVALID_ARGUMENT, "got: triton"),
    ],
)
def test_bad_settings_are_refused_and_change_nothing(
    changes: dict[str, list[str]], code: ErrorCode, message: str
) -> None:
    settings, provider, _ = configured("sampler=parentbased_always_on")
    rule = provider.sampler.rule  # type: ignore[attr-defined]
    # A good change beside the bad one is not applied either.
    with pytest.raises(InferdError) as refused:
        settings.update("simple", {"trace_rate": ["7"], **changes})
    assert refused.value.code is code
    assert message in str(refused.value)
    assert settings.current("simple") == defaults()
    assert provider.sampler.rule is rule  # type: ignore[attr-defined]


def test_mode_and_log_frequency_are_accepted_with_no_effect() -> None:
    settings, _, _ = configured("sampler=parentbased_always_on")
    assert settings.update("", {"trace_mode": ["opentelemetry"], "log_frequency": ["50"]}) == (
        defaults()
    )
    assert settings.update("", {"trace_mode": [], "log_frequency": []}) == defaults()
