"""What the data path reports about each request: its span (continuing the caller's trace), its
failure, and its log line when verbose. The core runs the inferences it has a route for, observed
or not, and reports each one the tracing rule samples (or every one, with verbose logs) once it is
answered: ``Telemetry.observed`` builds its span and line from the record. For a request that
reaches Python (no route in the core, or a sampler the core cannot apply) the servicer opens a
``RequestTelemetry`` and the data plane tells it which model version ran the request and how the
core timed it; otherwise only a failure is reported (``Telemetry.failed``). Counts and latencies
are the core's, read at scrape time (``inferd.observability.metrics``).

Spans: ``ModelInfer`` (server span, parent from the caller's ``traceparent``/``tracestate``) with
children ``queue`` and ``compute``, timed by the core (which also parses the request and writes
its answer, in microseconds: they have no spans of their own). Each executed batch is one
``batch`` span linked to the spans of the requests in it. An ensemble's request has, instead of
``queue`` and ``compute``, an ``ensemble`` child with a ``step`` child per step, each with the
``queue`` and ``compute`` of the step's request and linked from the batch that step rode in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from inferd.core import CoreTiming, ObservedRequest
from inferd.core import StatusCode as CoreStatusCode
from inferd.errors import ErrorCode, InferdError
from inferd.observability.logging import (
    REQUEST_METADATA,
    LogControl,
    already_logged,
    caller_trace_id,
    mark_logged,
)
from inferd.observability.metrics import InferenceMetrics
from inferd.observability.trace_settings import TraceSettings
from inferd.observability.tracing import (
    MODEL_ATTRIBUTE,
    REQUEST_SPAN,
    TRACE_SAMPLED_ATTRIBUTE,
    TRACE_SAMPLED_KEY,
    CoreSampledSampler,
    SamplingRule,
)

log = structlog.get_logger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()
# A batch whose requests did not all report (their callers went away) is exported this late.
_BATCH_STALE_NS = 5_000_000_000


@dataclass
class _PendingBatch:
    timing: CoreTiming
    model: str
    version: str
    reported: int = 0
    links: list[Link] = field(default_factory=list)


class BatchSpans:
    """Collects, per executed batch, the requests that rode in it, and exports the batch's span
    with a link to each once all have reported. Used on the event loop's thread only."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer
        self._pending: dict[tuple[str, str, int, int], _PendingBatch] = {}

    def add(self, model: str, version: str, timing: CoreTiming, span: trace.Span) -> None:
        key = (model, version, timing.batch_id, timing.compute_start)
        batch = self._pending.get(key)
        if batch is None:
            batch = self._pending[key] = _PendingBatch(timing, model, version)
            if len(self._pending) > 64:
                self._export_stale()
        batch.reported += 1
        if span.is_recording():
            batch.links.append(Link(span.get_span_context()))
        if batch.reported >= timing.batch_requests:
            del self._pending[key]
            self._export(batch)

    def _export_stale(self) -> None:
        now = CoreTiming.now_ns()
        for key, batch in list(self._pending.items()):
            if now - batch.timing.compute_end > _BATCH_STALE_NS:
                del self._pending[key]
                self._export(batch)

    def _export(self, batch: _PendingBatch) -> None:
        if not batch.links:
            return  # no request of the batch was sampled
        t = batch.timing
        span = self._tracer.start_span(
            "batch",
            context=otel_context.Context(),  # a root: it belongs to every request, not one
            kind=SpanKind.INTERNAL,
            links=batch.links,
            start_time=CoreTiming.wall_ns(t.compute_start),
            attributes={
                "inferd.model": batch.model,
                "inferd.model_version": batch.version,
                "inferd.batch_id": t.batch_id,
                "inferd.batch_size": t.batch_rows,
                "inferd.batch_requests": t.batch_requests,
                "inferd.instance": t.instance,
                "inferd.compute_input_us": (t.input_done - t.compute_start) / 1000,
                "inferd.compute_infer_us": (t.infer_done - t.input_done) / 1000,
                "inferd.compute_output_us": (t.compute_end - t.infer_done) / 1000,
            },
        )
        span.end(end_time=CoreTiming.wall_ns(t.compute_end))


class Telemetry:
    """The server's observability: tracer (None when tracing is off), metrics, log control."""

    def __init__(
        self,
        log_control: LogControl,
        metrics: InferenceMetrics | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.log_control = log_control
        self.metrics = metrics
        self.tracer_provider = tracer_provider
        self.tracer = tracer_provider.get_tracer("inferd") if tracer_provider else None
        self.batches = BatchSpans(self.tracer) if self.tracer else None
        sampler = tracer_provider.sampler if tracer_provider else None
        # Triton's TraceSetting: over the sampler the core applies too (None: cannot change).
        self.trace_settings = TraceSettings(
            sampler if isinstance(sampler, CoreSampledSampler) else None
        )

    @property
    def observes_each_request(self) -> bool:
        """Whether a request needs a ``RequestTelemetry`` of its own: a span (tracing is on) or
        a log line (verbose). Otherwise a request creates no telemetry object: its counts and
        latencies are the core's, read at scrape time, and only a failure is reported here."""
        return self.tracer is not None or self.log_control.verbose > 0

    @property
    def sampling(self) -> SamplingRule | None:
        """How the core picks the requests to trace, or None when it cannot (a tracer provider
        whose sampler is not ``CoreSampledSampler``: every request is then Python's to see)."""
        if self.tracer_provider is None:
            return None
        sampler = self.tracer_provider.sampler
        return sampler.rule if isinstance(sampler, CoreSampledSampler) else None

    @property
    def model_sampling(self) -> dict[str, SamplingRule]:
        """The models whose trace settings give them a rule of their own (by the name requests
        give), which the core applies to their requests instead of ``sampling``'s."""
        sampler = self.tracer_provider.sampler if self.tracer_provider else None
        return sampler.model_rules if isinstance(sampler, CoreSampledSampler) else {}

    def request(
        self, model_name: str, metadata: Sequence[tuple[str, Any]] | None, request_id: str = ""
    ) -> RequestTelemetry:
        return RequestTelemetry(self, model_name, metadata, request_id)

    def failed(
        self,
        model: str,
        version: str,
        error: BaseException,
        *,
        request_id: str = "",
        metadata: Sequence[tuple[str, Any]] | None = None,
    ) -> None:
        """A request that no ``RequestTelemetry`` observes failed on a known model version:
        counted, and logged when the failure is INTERNAL (see ``log_internal_failure``)."""
        code = _error_code(error)
        if self.metrics is not None:
            self.metrics.failed(model, version, code)
        if code is ErrorCode.INTERNAL:
            log_internal_failure(model, version, request_id, metadata, error)

    def unresolved(
        self,
        model: str,
        version: str,
        error: BaseException,
        *,
        request_id: str = "",
        metadata: Sequence[tuple[str, Any]] | None = None,
    ) -> None:
        """A request failed, maybe before a version was picked (a bug, or an error already
        counted and logged on its version): an INTERNAL one not logged yet gets its record, with the
        model and version as the request named them."""
        if _error_code(error) is ErrorCode.INTERNAL:
            log_internal_failure(model, version, request_id, metadata, error)

    def observed(self, record: ObservedRequest) -> None:
        """An inference the core ran and answered while Python observed it: its span, from the
        core's times, when the core sampled it, and its log line with verbose logs. Its failure is
        the core's to count and log (the transport's failure counts, its INTERNAL record)."""
        code = None if record.code == CoreStatusCode.OK else ErrorCode(int(record.code))
        span = self._observed_span(record, code)
        if self.log_control.verbose > 0:
            # The line carries the request's trace: its span's, else its caller's traceparent.
            token = REQUEST_METADATA.set(record.metadata)
            try:
                with trace.use_span(span or trace.INVALID_SPAN, end_on_exit=False):
                    log.info(
                        "inference",
                        model=record.model,
                        version=record.version,
                        outcome="OK" if code is None else code.name,
                        duration_us=round((record.answered - record.received) / 1000, 1),
                        batch_size=record.timing.batch_rows or None,
                    )
            finally:
                REQUEST_METADATA.reset(token)

    def _observed_span(self, record: ObservedRequest, code: ErrorCode | None) -> trace.Span | None:
        """The span of an observed inference the core sampled, with its children, ended; None
        when tracing is off or the core did not sample it."""
        tracer = self.tracer
        if tracer is None or not record.sampled:
            return None
        parent = _PROPAGATOR.extract(dict(record.metadata))
        attributes: dict[str, Any] = {
            "rpc.system": "grpc",
            MODEL_ATTRIBUTE: record.model,
            "inferd.model_version": record.version,
            TRACE_SAMPLED_ATTRIBUTE: True,  # the core sampled it
        }
        if record.streamed:
            attributes["inferd.responses"] = record.responses
        span = tracer.start_span(
            REQUEST_SPAN,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=CoreTiming.wall_ns(record.received),
        )
        if code is None:
            assert self.batches is not None
            _trace_computed(tracer, self.batches, span, record.model, record.version, record.timing)
        else:
            span.set_status(Status(StatusCode.ERROR, f"{code.name}: {record.message}"))
        span.end(end_time=CoreTiming.wall_ns(record.answered))
        return span

    def close(self) -> None:
        """Exports the spans still buffered and stops the exporter and the metrics endpoint."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.metrics is not None:
            self.metrics.close()


class RequestTelemetry:
    """One inference request's span, metrics and log line; a context manager around the
    request's handling in the transport."""

    __slots__ = (
        "_metadata",
        "_owner",
        "_span",
        "_start_ns",
        "_token",
        "model",
        "request_id",
        "timing",
        "version",
    )

    def __init__(
        self,
        owner: Telemetry,
        model: str,
        metadata: Sequence[tuple[str, Any]] | None,
        request_id: str = "",
    ) -> None:
        self._owner = owner
        self._metadata = metadata
        self.request_id = request_id
        self._span: trace.Span | None = None
        self._token: object | None = None
        self.model = model
        self.version = ""  # set once the data plane has picked the version
        self.timing: CoreTiming | None = None

    def __enter__(self) -> RequestTelemetry:
        self._start_ns = time.monotonic_ns()
        tracer = self._owner.tracer
        if tracer is not None:
            carrier = {k: v for k, v in self._metadata or () if isinstance(v, str)}
            parent = _PROPAGATOR.extract(carrier)
            attributes: dict[str, Any] = {"rpc.system": "grpc", MODEL_ATTRIBUTE: self.model}
            if carrier.get(TRACE_SAMPLED_KEY) == "1":
                attributes[TRACE_SAMPLED_ATTRIBUTE] = True  # the core sampled it
            self._span = tracer.start_span(
                REQUEST_SPAN,
                context=parent,
                kind=SpanKind.SERVER,
                attributes=attributes,
                # On the core's clock, as its queue and compute children are: the wall clock
                # and the converted core times may disagree by a microsecond.
                start_time=CoreTiming.wall_ns(CoreTiming.now_ns()),
            )
            self._token = otel_context.attach(trace.set_span_in_context(self._span, parent))
        else:
            self._token = REQUEST_METADATA.set(self._metadata)
        return self

    def resolved(self, model: str, version: str) -> None:
        """The data plane found the version that will answer."""
        self.model, self.version = model, version

    def computed(self, timing: CoreTiming) -> None:
        """The core computed the request: record its queue and compute spans, or, for an
        ensemble's request, its ``ensemble`` span and a ``step`` span per step."""
        self.timing = timing
        span, owner = self._span, self._owner
        if span is None or owner.tracer is None:
            return
        if span.is_recording():
            span.set_attribute("inferd.model_version", self.version)
        assert owner.batches is not None
        _trace_computed(owner.tracer, owner.batches, span, self.model, self.version, timing)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        duration_us = (time.monotonic_ns() - self._start_ns) / 1000
        code = _error_code(error) if error is not None else None
        owner = self._owner
        if owner.metrics is not None and self.version and code is not None:
            owner.metrics.failed(self.model, self.version, code)
        if code is ErrorCode.INTERNAL:
            assert error is not None
            # While the request's span is current: the record carries its trace id.
            log_internal_failure(self.model, self.version, self.request_id, self._metadata, error)
        if owner.log_control.verbose > 0:
            log.info(
                "inference",
                model=self.model,
                version=self.version,
                outcome="OK" if code is None else code.name,
                duration_us=round(duration_us, 1),
                batch_size=self.timing.batch_rows if self.timing else None,
            )
        if self._span is not None:
            if code is not None:
                self._span.set_status(Status(StatusCode.ERROR, f"{code.name}: {error}"))
            self._span.end(end_time=CoreTiming.wall_ns(CoreTiming.now_ns()))
            otel_context.detach(self._token)  # type: ignore[arg-type]
        else:
            REQUEST_METADATA.reset(self._token)  # type: ignore[arg-type]


def _trace_computed(
    tracer: trace.Tracer,
    batches: BatchSpans,
    span: trace.Span,
    model: str,
    version: str,
    timing: CoreTiming,
) -> None:
    """The spans of a computed request, under ``span``, the one that stands for it (its
    ``ModelInfer``, or the ``step`` of the ensemble that submitted it). A model's request gets
    ``queue`` and ``compute`` children and a link from its batch's span; an ensemble's request
    rides no batch itself (``timing.steps`` lists its steps): it gets an ``ensemble`` child
    spanning its run in the core, with a ``step`` child per finished step (from its submission to
    the composing version to its answer), each treated here as a request of that version, so that
    the batch a step rode in links the step, whichever traffic shared the batch. A span that is
    not recorded gets no children, but its batches still count it."""
    recording = span.is_recording()
    if not timing.steps:
        if recording:
            span.set_attributes(
                {
                    "inferd.queue_us": (timing.compute_start - timing.enqueued) / 1000,
                    "inferd.batch_id": timing.batch_id,
                    "inferd.batch_size": timing.batch_rows,
                    "inferd.batch_requests": timing.batch_requests,
                    "inferd.instance": timing.instance,
                }
            )
            parent = trace.set_span_in_context(span)
            for name, start, end in (
                ("queue", timing.enqueued, timing.compute_start),
                ("compute", timing.compute_start, timing.compute_end),
            ):
                child = tracer.start_span(
                    name,
                    context=parent,
                    start_time=CoreTiming.wall_ns(start),
                    attributes={"inferd.batch_id": timing.batch_id},
                )
                child.end(end_time=CoreTiming.wall_ns(end))
        batches.add(model, version, timing, span)
        return
    ensemble = span
    if recording:
        ensemble = tracer.start_span(
            "ensemble",
            context=trace.set_span_in_context(span),
            start_time=CoreTiming.wall_ns(timing.enqueued),
            attributes={
                "inferd.model": model,
                "inferd.model_version": version,
                "inferd.ensemble_steps": len(timing.steps),
            },
        )
    for step in timing.steps:
        step_span = ensemble
        if recording:
            step_span = tracer.start_span(
                "step",
                context=trace.set_span_in_context(ensemble),
                start_time=CoreTiming.wall_ns(step.submitted),
                attributes={
                    "inferd.step": step.step,
                    "inferd.model": step.model,
                    "inferd.model_version": str(step.version),
                },
            )
        _trace_computed(tracer, batches, step_span, step.model, str(step.version), step.timing)
        if recording:
            step_span.end(end_time=CoreTiming.wall_ns(step.answered))
    if recording:
        ensemble.end(end_time=CoreTiming.wall_ns(timing.compute_end))


def log_internal_failure(
    model: str,
    version: str,
    request_id: str,
    metadata: Sequence[tuple[str, Any]] | None,
    error: BaseException,
) -> None:
    """The one record of a request that failed with INTERNAL (an executor's failure or a bug),
    at error level, so that the default verbosity shows it: model, version ("" when none was
    picked yet), the request's id, the caller's trace id (with tracing on, the request span's;
    else from its ``traceparent``, when it sent one) and the reason. An unexpected exception also
    carries its traceback. Logs nothing for an error already logged (``mark_logged``)."""
    if already_logged(error):
        return
    mark_logged(error)
    fields: dict[str, Any] = {
        "model": model,
        "version": version,
        "request_id": request_id,
        "code": ErrorCode.INTERNAL.name,
    }
    span = trace.get_current_span().get_span_context()
    trace_id = format(span.trace_id, "032x") if span.is_valid else caller_trace_id(metadata)
    if trace_id is not None:
        fields["trace_id"] = trace_id
    if isinstance(error, InferdError):
        log.error("request failed", reason=str(error), **fields)
    else:
        reason = f"{type(error).__name__}: {error}"
        log.error("request failed", reason=reason, exc_info=error, **fields)


def _error_code(error: BaseException) -> ErrorCode:
    if isinstance(error, InferdError):
        return error.code
    if isinstance(error, asyncio.CancelledError):  # the caller went away
        return ErrorCode.CANCELLED
    return ErrorCode.INTERNAL
