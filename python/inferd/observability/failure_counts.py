"""``nv_inference_request_failure``: failures are counted by reason as they happen, since a
request the core refuses never reaches its counters."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from inferd.errors import ErrorCode

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


class FailureCounts(Collector):
    """``nv_inference_request_failure`` by model, version and reason, under Triton's name (see
    core_metrics.py's CoreStatisticsCollector on why it is untyped). Counted on the event loop's
    thread; the copy taken at scrape time is one C-level dict copy, safe under the GIL. Every
    loaded version (``loaded``: its (model, version) pairs, read at scrape time) has all four
    reasons, at 0 until one happens, as in Triton: a rate or an alert on them has a series from
    the start."""

    def __init__(self, loaded: Callable[[], Iterable[tuple[str, str]]] = tuple) -> None:
        self._loaded = loaded
        self._counts: dict[tuple[str, str, str], int] = {}
        self._sources: list[Callable[[], Iterable[tuple[str, str, ErrorCode, str, int]]]] = []

    def count(self, model: str, version: str, reason: str) -> None:
        """A failure Python answered (a request the core forwarded to it: gRPC's)."""
        key = (model, version, reason)
        self._counts[key] = self._counts.get(key, 0) + 1

    def add_source(
        self, source: Callable[[], Iterable[tuple[str, str, ErrorCode, str, int]]]
    ) -> None:
        """Failures counted elsewhere (the core's transports), read at scrape time as
        (model, version, code, protocol, count)."""
        self._sources.append(source)

    def collect(self) -> Iterator[Metric]:
        name = "nv_inference_request_failure"
        metric = Metric(
            name, "Number of failed inference requests, all batch sizes (cumulative)", "unknown"
        )
        counts = {
            (model, version, reason): 0 for model, version in self._loaded() for reason in REASONS
        }
        # The same failures by the protocol they came on: inferd's own family beside Triton's.
        by_protocol: dict[tuple[str, str, str, str], int] = {}
        for (model, version, reason), count in dict(self._counts).items():
            counts[(model, version, reason)] = counts.get((model, version, reason), 0) + count
            key = (model, version, reason, "grpc")
            by_protocol[key] = by_protocol.get(key, 0) + count
        for source in self._sources:
            for model, version, code, protocol, count in source():
                reason = FAILURE_REASONS.get(code, "OTHER")
                counts[(model, version, reason)] = counts.get((model, version, reason), 0) + count
                key = (model, version, reason, protocol)
                by_protocol[key] = by_protocol.get(key, 0) + count
        for (model, version, reason), value in counts.items():
            metric.add_sample(name, {"model": model, "version": version, "reason": reason}, value)
        yield metric
        protocol_name = "inferd_inference_request_failure"
        protocol_metric = Metric(
            protocol_name,
            "Failed inference requests by the protocol they came on, grpc or http (cumulative)",
            "unknown",
        )
        for (model, version, reason, protocol), value in by_protocol.items():
            protocol_metric.add_sample(
                protocol_name,
                {"model": model, "version": version, "reason": reason, "protocol": protocol},
                value,
            )
        yield protocol_metric
