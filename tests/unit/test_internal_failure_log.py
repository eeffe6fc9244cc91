"""A request that fails with INTERNAL, in the transport's Python path, logs exactly one record at
the default verbosity: model, version, request id, the caller's trace id and the reason; other
failures log none. The data plane is a stand-in that fails as the real one does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

from inferd.errors import Internal, InvalidArgument, NotFound
from inferd.observability.logging import LogControl
from inferd.observability.telemetry import Telemetry
from inferd.observability.tracing import create_tracer_provider
from inferd.transport.servicer import InferenceServicer, ServerState

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = ("traceparent", f"00-{CALLER_TRACE}-00f067aa0ba902b7-01")


@dataclass
class Parsed:
    model_name: str = "m"
    model_version: str = ""
    id: str = "request-7"


class FailingDataPlane:
    """Resolves every request to version 3, then fails with ``error`` (before resolving, with
    ``before_version``), telling ``on_failure`` / ``observed`` as the real data plane does."""

    def __init__(self, error: Exception, *, before_version: bool = False) -> None:
        self.error = error
        self.before_version = before_version

    def parse(self, data: bytes) -> Parsed:
        return Parsed()

    async def infer(
        self,
        request: Parsed,
        *,
        deadline_s: float | None = None,
        observed: Any = None,
        on_failure: Callable[[str, str, BaseException], None] | None = None,
        shared_memory: Any = None,
        routed_version: str | None = None,
    ) -> bytes:
        if self.before_version:
            raise self.error
        if observed is not None:
            observed.resolved("m", "3")
        if on_failure is not None:
            on_failure("m", "3", self.error)
        raise self.error


class Aborted(Exception):
    pass


class Context:
    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self.metadata = tuple(metadata)
        self.code: grpc.StatusCode | None = None

    def time_remaining(self) -> float | None:
        return None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise Aborted(details)


def telemetry(kind: str) -> Telemetry:
    if kind == "traced":
        provider = create_tracer_provider("", environ={}, exporter=InMemorySpanExporter())
        return Telemetry(LogControl(), None, provider)
    return Telemetry(LogControl(verbose=1 if kind == "verbose" else 0))


async def fail(
    error: Exception,
    kind: str = "plain",
    metadata: Sequence[tuple[str, str]] = (TRACEPARENT,),
    *,
    before_version: bool = False,
) -> tuple[grpc.StatusCode | None, list[dict[str, Any]]]:
    observing = telemetry(kind)
    servicer = InferenceServicer(
        FailingDataPlane(error, before_version=before_version),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        ServerState(),
        observing,
    )
    context = Context(metadata)
    try:
        with capture_logs() as records, pytest.raises(Aborted):
            await servicer.ModelInfer(b"", context)  # type: ignore[arg-type]
    finally:
        if observing.tracer_provider is not None:
            observing.tracer_provider.shutdown()
    return context.code, [r for r in records if r["log_level"] in ("error", "critical")]


@pytest.mark.parametrize("kind", ["plain", "verbose", "traced"])
async def test_an_executor_failure_logs_one_record(kind: str) -> None:
    code, records = await fail(Internal("ONNX Runtime: Gather: index 9 out of range"), kind)
    assert code == grpc.StatusCode.INTERNAL
    assert len(records) == 1, records
    record = records[0]
    assert record["event"] == "request failed"
    assert record["model"] == "m"
    assert record["version"] == "3"
    assert record["request_id"] == "request-7"
    assert record["reason"] == "ONNX Runtime: Gather: index 9 out of range"
    assert record["trace_id"] == CALLER_TRACE  # the span continues the caller's trace


@pytest.mark.parametrize("kind", ["plain", "verbose"])
async def test_an_unexpected_exception_logs_one_record_with_its_traceback(kind: str) -> None:
    code, records = await fail(KeyError("lost"), kind)
    assert code == grpc.StatusCode.INTERNAL
    assert len(records) == 1, records
    record = records[0]
    assert record["event"] == "request failed"
    assert (record["model"], record["version"], record["request_id"]) == ("m", "3", "request-7")
    assert record["reason"] == "KeyError: 'lost'"
    assert isinstance(record["exc_info"], KeyError)


async def test_a_failure_before_the_version_is_picked_logs_one_record() -> None:
    code, records = await fail(RuntimeError("registry broke"), before_version=True)
    assert code == grpc.StatusCode.INTERNAL
    assert len(records) == 1, records
    assert records[0]["event"] == "request failed"
    assert (records[0]["model"], records[0]["version"]) == ("m", "")
    assert records[0]["reason"] == "RuntimeError: registry broke"


async def test_without_a_traceparent_the_record_has_no_trace_id() -> None:
    _, records = await fail(Internal("failed"), metadata=())
    assert len(records) == 1
    assert "trace_id" not in records[0]


@pytest.mark.parametrize("kind", ["plain", "verbose"])
async def test_other_failures_log_no_error_record(kind: str) -> None:
    for error in (InvalidArgument("bad shape"), NotFound("no such model")):
        code, records = await fail(error, kind)
        assert code is not None and code != grpc.StatusCode.INTERNAL
        assert records == []
