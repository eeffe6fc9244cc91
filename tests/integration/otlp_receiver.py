"""A real OTLP/gRPC trace receiver for tests: inferd exports to it over a TCP connection."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class OtlpTraceReceiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """Collects every exported span; ``endpoint`` is what OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    should say."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[Any] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{port}"
        self._server.start()

    def Export(self, request: Any, context: Any) -> Any:
        with self._lock:
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    self._spans.extend(scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[Any]:
        with self._lock:
            return list(self._spans)

    def wait_for(self, count: int, name: str, timeout_s: float = 20.0) -> list[Any]:
        """At least ``count`` spans called ``name``; fails the test past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [s for s in self.spans() if s.name == name]
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, f"{len(found)}/{count} {name!r} spans arrived"
            time.sleep(0.05)

    def stop(self) -> None:
        self._server.stop(None)
