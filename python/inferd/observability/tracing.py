"""The OpenTelemetry tracer provider: OTLP over gRPC, chosen by ``--trace-config`` or by the
standard ``OTEL_*`` environment variables, and off unless one of them asks for it."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

TRACE_CONFIG_KEYS = ("endpoint", "sampler", "sampler_arg")


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


def _sampler(name: str, argument: str) -> Sampler:
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
    return samplers[name]()


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
    sampler = None  # the SDK then reads OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG
    if "sampler" in config:
        sampler = _sampler(config["sampler"], config.get("sampler_arg", ""))
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": "inferd"}
    provider = TracerProvider(sampler=sampler, resource=Resource.create(attributes))
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
