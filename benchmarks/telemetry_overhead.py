"""What the per-request telemetry costs on the event loop's thread, in µs of CPU per request:
the same calls the transport and data plane make for one ModelInfer, in-process and timed, with
tracing off and metrics off, tracing off (metrics on: the default), and tracing on with 1% and
100% sampling (spans go to an in-memory exporter, so export cost is not counted here; the
end-to-end benchmark, benchmarks/tracing.py, counts it).

    python benchmarks/telemetry_overhead.py [--requests 20000]
"""

from __future__ import annotations

import argparse
import os
import time

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferd.core import CoreTiming
from inferd.observability.logging import LogControl
from inferd.observability.metrics import InferenceMetrics
from inferd.observability.telemetry import Telemetry
from inferd.observability.tracing import create_tracer_provider


def per_request_us(telemetry: Telemetry, requests: int) -> float:
    metadata = (("user-agent", "grpc-c++/1.60"), ("te", "trailers"))
    now = CoreTiming.now_ns()
    timings = [
        CoreTiming(now, now + 10, now + 20, now + 30, now + 40, i, 1, 1, 0) for i in range(requests)
    ]
    started = time.process_time_ns()
    for timing in timings:
        with telemetry.request("simple", metadata) as observed:
            with observed.stage("decode"):
                pass
            observed.resolved("simple", "1")
            observed.computed(timing)
            with observed.stage("encode"):
                pass
    return (time.process_time_ns() - started) / requests / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()
    configs = {
        "tracing off, metrics off": lambda: Telemetry(LogControl()),
        "tracing off, metrics on (default)": lambda: Telemetry(
            LogControl(), InferenceMetrics(lambda: [], gpu=False)
        ),
    }
    for label, ratio in (("1%", "0.01"), ("100%", "1.0")):

        def traced(ratio: str = ratio) -> Telemetry:
            environ = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": ratio}
            os.environ.update(environ)  # the SDK's sampler reads the process environment
            provider = create_tracer_provider("", environ=environ, exporter=InMemorySpanExporter())
            return Telemetry(LogControl(), InferenceMetrics(lambda: [], gpu=False), provider)

        configs[f"tracing on, {label} sampled, metrics on"] = traced
    print(f"{args.requests} requests each; CPU µs per request on the calling thread")
    for name, make in configs.items():
        telemetry = make()
        per_request_us(telemetry, 1000)  # warm up
        figures = sorted(per_request_us(telemetry, args.requests) for _ in range(3))
        print(f"  {name:40s} {figures[1]:7.2f} µs (median of 3)")
        telemetry.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
