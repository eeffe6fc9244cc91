"""The OpenTelemetry tracer provider: OTLP over gRPC, chosen by ``--trace-config`` or by the
standard ``OTEL_*`` environment variables, and off unless one of them asks for it.

Which requests are traced is decided twice over: the core's transport applies the sampler's rule
(``SamplingRule``) to each inference before anything else, serves the requests it does not trace
itself, and sends the others to Python marked ``inferd-trace-sampled: 1``; Python's sampler
(``CoreSampledSampler``) records a marked request whatever it would draw, and decides every other
span (a request Python answers for another reason) as configured. Both follow the trace settings
a client changes at run time (``trace_settings.TraceSettings``): a rule per model, and a budget of
traces shared by the two."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind, TraceState, get_current_span
from opentelemetry.util.types import Attributes

from inferd.core import TraceBudget

# The gRPC metadata key the core adds to an inference it sampled (cpp/include/inferd/grpc_calls.h,
# kTraceSampledKey), and the span attribute the transport turns it into for the sampler.
log = structlog.get_logger(__name__)

TRACE_SAMPLED_KEY = "inferd-trace-sampled"
TRACE_SAMPLED_ATTRIBUTE = "inferd.trace_sampled"

TRACE_CONFIG_KEYS = ("endpoint", "sampler", "sampler_arg")
# The span of one inference request: what a trace setting's rule and budget decide.
REQUEST_SPAN = "ModelInfer"
MODEL_ATTRIBUTE = "inferd.model"


def parse_trace_config(text: str) -> dict[str, str]:
    """``endpoint=127.0.0.1:4317,sampler=parentbased_traceidratio,sampler_arg=0.1`` -> dict."""
    config: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in TRACE_CONFIG_KEYS:
            raise ValueError(
                f"--trace-config item {item!r}: expected KEY=VALUE with KEY one of "
                f"{', '.join(TRACE_CONFIG_KEYS)}"
            )
        config[key] = value
    return config


def tracing_requested(config: Mapping[str, str], environ: Mapping[str, str]) -> bool:
    """On when --trace-config names an endpoint, or the environment names an OTLP exporter or
    endpoint (and does not disable the SDK)."""
    if environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if "endpoint" in config:
        return True
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").lower()
    if exporter == "none":
        return False
    return exporter == "otlp" or any(
        environ.get(key)
        for key in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


@dataclass(frozen=True)
class SamplingRule:
    """An OpenTelemetry built-in sampler as the core applies it: a caller's valid ``traceparent``
    decides by its sampled flag when ``parent_based``; otherwise a trace is sampled when its id's
    lower 64 bits fall below ``ratio`` x 2^64 (TraceIdRatioBased; always_on is 1, always_off 0).
    ``budget``: the traces left to take (Triton's trace_count, shared with the core; None:
    unlimited); a sampled request takes one, and none is sampled once it is spent."""

    parent_based: bool
    ratio: float
    budget: TraceBudget | None = None

    @property
    def samples_nothing(self) -> bool:
        return not self.parent_based and self.ratio <= 0.0


def rule_sampler(rule: SamplingRule) -> Sampler:
    """The OpenTelemetry sampler that decides as ``rule`` does (its budget aside)."""
    if rule.samples_nothing:
        return ALWAYS_OFF
    root = TraceIdRatioBased(rule.ratio)
    return ParentBased(root) if rule.parent_based else root


class CoreSampledSampler(Sampler):
    """``inner``, except that a span started with ``TRACE_SAMPLED_ATTRIBUTE`` (a request the core
    sampled) is recorded and sampled, without that attribute, and so is a child of a span this
    process records (its trace is taken already). ``rule``: ``inner``'s decision as the core
    applies it, or None when the core cannot (it then sends every inference to Python).
    ``configure`` replaces both, and gives models rules of their own: a request span
    (``REQUEST_SPAN``) of such a model is decided by its model's rule, and takes a trace of the
    rule's budget when sampled. Configured on the event loop's thread; ``should_sample`` runs on
    whichever thread starts a span, and reads each setting in one step."""

    def __init__(self, inner: Sampler, rule: SamplingRule | None) -> None:
        self.inner = inner
        self.rule = rule
        self._models: dict[str, tuple[Sampler, SamplingRule]] = {}

    @property
    def model_rules(self) -> dict[str, SamplingRule]:
        """The models with rules of their own."""
        return {model: rule for model, (_, rule) in self._models.items()}

    def configure(self, rule: SamplingRule, model_rules: dict[str, SamplingRule]) -> None:
        """``rule`` for every request, but those of the models in ``model_rules``."""
        self.inner, self.rule = rule_sampler(rule), rule
        self._models = {model: (rule_sampler(r), r) for model, r in model_rules.items()}

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        parent = get_current_span(parent_context).get_span_context()
        if attributes and attributes.get(TRACE_SAMPLED_ATTRIBUTE):
            return SamplingResult(
                Decision.RECORD_AND_SAMPLE,
                {k: v for k, v in attributes.items() if k != TRACE_SAMPLED_ATTRIBUTE},
                parent.trace_state if parent.is_valid else None,
            )
        if parent.is_valid and not parent.is_remote and parent.trace_flags.sampled:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, parent.trace_state)
        inner, rule = self.inner, self.rule
        if name == REQUEST_SPAN and attributes:
            model = attributes.get(MODEL_ATTRIBUTE)
            own = self._models.get(model) if isinstance(model, str) else None
            if own is not None:
                inner, rule = own
        result = inner.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )
        if (
            name == REQUEST_SPAN
            and result.decision is Decision.RECORD_AND_SAMPLE
            and rule is not None
            and rule.budget is not None
            and not rule.budget.take()
        ):
            return SamplingResult(Decision.DROP)
        return result

    def get_description(self) -> str:
        return f"CoreSampled{{{self.inner.get_description()}}}"


# OpenTelemetry's built-in samplers (the names OTEL_TRACES_SAMPLER takes), by whether they
# follow the parent.
_PARENT_BASED = {
    "always_on": False,
    "always_off": False,
    "traceidratio": False,
    "parentbased_always_on": True,
    "parentbased_always_off": True,
    "parentbased_traceidratio": True,
}


def _sampler(name: str, argument: str) -> tuple[Sampler, SamplingRule]:
    def ratio() -> float:
        try:
            value = float(argument or 1.0)
        except ValueError:
            raise ValueError(f"sampler_arg {argument!r} is not a number") from None
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"sampler_arg {value} is outside 0..1")
        return value

    samplers: dict[str, Callable[[], Sampler]] = {
        "always_on": lambda: ALWAYS_ON,
        "always_off": lambda: ALWAYS_OFF,
        "traceidratio": lambda: TraceIdRatioBased(ratio()),
        "parentbased_always_on": lambda: ParentBased(ALWAYS_ON),
        "parentbased_always_off": lambda: ParentBased(ALWAYS_OFF),
        "parentbased_traceidratio": lambda: ParentBased(TraceIdRatioBased(ratio())),
    }
    if name not in samplers:
        raise ValueError(f"unknown sampler {name!r} (one of {', '.join(samplers)})")
    fixed = {"always_on": 1.0, "always_off": 0.0}
    rule_ratio = fixed.get(name.removeprefix("parentbased_"))
    rule = SamplingRule(_PARENT_BASED[name], ratio() if rule_ratio is None else rule_ratio)
    return samplers[name](), rule


def _configured_sampler(config: Mapping[str, str], environ: Mapping[str, str]) -> Sampler:
    """--trace-config's sampler, else OTEL_TRACES_SAMPLER's read as the SDK reads it: an unknown
    name is parentbased_always_on (the default) and an unreadable ratio is 1.0, with a warning."""
    if "sampler" in config:
        inner, rule = _sampler(config["sampler"], config.get("sampler_arg", ""))
        return CoreSampledSampler(inner, rule)
    name = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").lower()
    if name not in _PARENT_BASED:
        log.warning("unknown OTEL_TRACES_SAMPLER: parentbased_always_on", sampler=name)
        name = "parentbased_always_on"
    argument = environ.get("OTEL_TRACES_SAMPLER_ARG", "")
    try:
        float(argument or 1.0)
    except ValueError:
        log.warning("OTEL_TRACES_SAMPLER_ARG is not a number: ratio 1.0", sampler_arg=argument)
        argument = ""
    inner, rule = _sampler(name, argument)
    return CoreSampledSampler(inner, rule)


def create_tracer_provider(
    trace_config: str,
    environ: Mapping[str, str] | None = None,
    exporter: SpanExporter | None = None,
) -> TracerProvider | None:
    """The provider spans are exported through, or None when tracing is off. ``exporter``
    replaces OTLP (tests pass an in-memory one)."""
    environ = os.environ if environ is None else environ
    config = parse_trace_config(trace_config)
    if exporter is None and not tracing_requested(config, environ):
        return None
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": "inferd"}
    provider = TracerProvider(
        sampler=_configured_sampler(config, environ), resource=Resource.create(attributes)
    )
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        endpoint = config.get("endpoint")
        exporter = (
            OTLPSpanExporter(endpoint=endpoint, insecure=not endpoint.startswith("https://"))
            if endpoint
            else OTLPSpanExporter()  # OTEL_EXPORTER_OTLP_* decide
        )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
