"""The metrics layer without a server: failure series from a version's load, no ``*_created``
series, ``/metrics`` as the only path, host CPU and memory from ``/proc``, and model load
failures counted as the registry reports them."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, Summary, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import inferd._core as _core
from inferd.core import CompletionDispatcher, HostBufferPool
from inferd.errors import ErrorCode, ModelLoadError
from inferd.examples import make_examples
from inferd.executors import OnnxRuntimeOptions
from inferd.models import ModelRegistry
from inferd.observability.failure_counts import REASONS
from inferd.observability.host_metrics import HostCollector
from inferd.observability.metrics import InferenceMetrics
from inferd.observability.model_counters import ModelCounters
from inferd.repository import ModelRepository

STATISTICS = _core.StatisticsSnapshot()  # a version that has computed nothing


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def failures(text: str) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["model"], s.labels["version"], s.labels["reason"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "nv_inference_request_failure"
    }


def metrics_with(*versions: tuple[str, str], proc: Path = Path("/proc")) -> InferenceMetrics:
    return InferenceMetrics(
        lambda: [ModelCounters(name, version, STATISTICS, 0) for name, version in versions],
        gpu=False,
        proc=proc,
    )


def test_each_loaded_version_has_every_failure_reason_at_zero_before_any_failure() -> None:
    metrics = metrics_with(("m", "1"), ("m", "2"))
    text = generate_latest(metrics.registry).decode()
    assert failures(text) == {("m", v, r): 0 for v in ("1", "2") for r in REASONS}
    assert set(REASONS) == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}  # Triton's
    metrics.failed("m", "1", ErrorCode.RESOURCE_EXHAUSTED)
    metrics.failed("m", "1", ErrorCode.CANCELLED)
    metrics.failed("m", "1", ErrorCode.CANCELLED)
    counted = failures(generate_latest(metrics.registry).decode())
    assert counted[("m", "1", "REJECTED")] == 1
    assert counted[("m", "1", "CANCELED")] == 2
    assert counted[("m", "1", "BACKEND")] == counted[("m", "1", "OTHER")] == 0
    assert all(counted[("m", "2", r)] == 0 for r in REASONS)


def test_failures_are_also_counted_by_the_protocol_they_came_on() -> None:
    metrics = metrics_with(("m", "1"))
    metrics.failed("m", "1", ErrorCode.INTERNAL)  # answered by Python: a forwarded gRPC request
    metrics.failures.add_source(
        lambda: [
            ("m", "1", ErrorCode.RESOURCE_EXHAUSTED, "http", 2),
            ("m", "1", ErrorCode.RESOURCE_EXHAUSTED, "grpc", 3),
        ]
    )
    text = generate_latest(metrics.registry).decode()
    # Triton's family sums the protocols.
    assert failures(text)[("m", "1", "REJECTED")] == 5
    assert failures(text)[("m", "1", "BACKEND")] == 1
    by_protocol = {
        (s.labels["reason"], s.labels["protocol"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "inferd_inference_request_failure"
        for s in family.samples
        if s.labels["model"] == "m" and s.labels["version"] == "1"
    }
    assert by_protocol == {("BACKEND", "grpc"): 1, ("REJECTED", "http"): 2, ("REJECTED", "grpc"): 3}


def test_the_loaded_versions_can_come_from_a_cheaper_source_than_the_snapshot() -> None:
    metrics = InferenceMetrics(lambda: [], gpu=False, loaded=lambda: [("fast", "3")])
    text = generate_latest(metrics.registry).decode()
    assert failures(text) == {("fast", "3", r): 0 for r in REASONS}


@pytest.fixture
def served() -> Iterator[tuple[InferenceMetrics, str]]:
    metrics = metrics_with(("m", "1"))
    port = metrics.serve("127.0.0.1", 0)
    try:
        yield metrics, f"http://127.0.0.1:{port}"
    finally:
        metrics.close()


def get(url: str, accept: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read().decode()


OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def test_no_created_series_in_either_format_whatever_collector_is_registered(
    served: tuple[InferenceMetrics, str],
) -> None:
    metrics, base = served
    metrics.load_failed("broken")
    # prometheus_client's own metric classes write *_created by default: any added later must
    # not bring them to the endpoint.
    Counter("extra_events", "x", registry=metrics.registry).inc()
    Histogram("extra_seconds", "x", registry=metrics.registry).observe(0.1)
    Summary("extra_size", "x", registry=metrics.registry).observe(3)
    for accept in (None, OPENMETRICS):
        status, text = get(f"{base}/metrics", accept)
        assert status == 200
        assert "inferd_model_load_failures_total" in text
        assert "extra_seconds_bucket" in text and "extra_size_count" in text
        assert "_created" not in text, accept
    status, text = get(f"{base}/metrics?name[]=extra_events_total&name[]=extra_events_created")
    assert status == 200
    assert "extra_events_total 1.0" in text and "_created" not in text
    # No process-wide switch was thrown: another registry still gets its *_created.
    other = CollectorRegistry()
    Counter("elsewhere", "x", registry=other)
    assert "elsewhere_created" in generate_latest(other).decode()


def test_only_the_metrics_path_answers(served: tuple[InferenceMetrics, str]) -> None:
    _, base = served
    status, text = get(f"{base}/metrics")
    assert status == 200 and "nv_inference_request_failure" in text
    assert get(f"{base}/metrics?x=1")[0] == 200  # a query is not another path
    for path in ("/", "/metric", "/metrics/", "/favicon.ico", "/metrics/x", "/v2/health/ready"):
        status, text = get(base + path)
        assert status == 404, path
        assert "nv_" not in text


def write_proc(root: Path, busy: int, idle: int, total_kb: int, available_kb: int) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    (root / "stat").write_text(
        f"cpu  {busy - 6} 1 2 {idle - 4} 4 1 1 1 7 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n"
    )
    (root / "meminfo").write_text(
        f"MemTotal:       {total_kb} kB\nMemFree:          1000 kB\n"
        f"MemAvailable:   {available_kb} kB\nBuffers:            10 kB\n"
    )


def host_figures(metrics: InferenceMetrics) -> dict[str, float]:
    found = samples(generate_latest(metrics.registry).decode())
    names = ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes")
    return {name: found[(name, ())] for name in names if (name, ()) in found}


def test_host_cpu_utilisation_is_the_busy_share_since_the_previous_scrape(tmp_path: Path) -> None:
    write_proc(tmp_path, busy=100, idle=300, total_kb=8_000, available_kb=6_000)
    collector = HostCollector(tmp_path)
    write_proc(tmp_path, busy=130, idle=310, total_kb=8_000, available_kb=5_000)
    figures = {m.name: m.samples[0].value for m in collector.collect()}
    assert figures["nv_cpu_utilization"] == pytest.approx(30 / 40)
    assert figures["nv_cpu_memory_total_bytes"] == 8_000 * 1024
    assert figures["nv_cpu_memory_used_bytes"] == 3_000 * 1024  # total - available, as Triton
    # The next scrape measures from this one; no time passed: 0, not a division by zero.
    figures = {m.name: m.samples[0].value for m in collector.collect()}
    assert figures["nv_cpu_utilization"] == 0.0
    write_proc(tmp_path, busy=131, idle=319, total_kb=8_000, available_kb=5_000)
    assert next(iter(collector.collect())).samples[0].value == pytest.approx(1 / 10)


def test_host_figures_are_on_the_endpoint_from_the_real_proc() -> None:
    metrics = metrics_with()
    figures = host_figures(metrics)
    assert 0.0 <= figures["nv_cpu_utilization"] <= 1.0
    assert 0 < figures["nv_cpu_memory_used_bytes"] < figures["nv_cpu_memory_total_bytes"]


def test_host_figures_that_cannot_be_read_are_left_out(tmp_path: Path) -> None:
    assert host_figures(metrics_with(proc=tmp_path / "absent")) == {}
    (tmp_path / "stat").write_text("intr 1 2 3\n")
    (tmp_path / "meminfo").write_text("MemTotal: 10 kB\n")  # no MemAvailable
    assert host_figures(metrics_with(proc=tmp_path)) == {}


def load_failures(metrics: InferenceMetrics) -> dict[str, float]:
    return {
        s.labels["model"]: s.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in family.samples
        if s.name == "inferd_model_load_failures_total"
    }


async def test_failed_model_loads_are_counted_by_model(tmp_path: Path) -> None:
    make_examples(tmp_path)
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "model.onnx").write_bytes(b"not an ONNX model")
    registry = ModelRegistry(
        ModelRepository(tmp_path),
        CompletionDispatcher(asyncio.get_running_loop()),
        HostBufferPool(1 << 24),
        default_max_batch_size=4,
        onnxruntime_options=OnnxRuntimeOptions(1, 1),
    )
    metrics = InferenceMetrics(lambda: [], gpu=False)
    registry.add_load_failure_listener(metrics.load_failed)
    assert load_failures(metrics) == {}
    registry.load_all(["simple", "broken"])  # at startup: recorded, not raised
    assert load_failures(metrics) == {"broken": 1}
    with pytest.raises(ModelLoadError):
        await registry.load("broken")  # a load call
    await registry.load("simple")  # a good one counts nothing
    assert load_failures(metrics) == {"broken": 2}
    await registry.close()


def test_decoupled_models_responses_and_first_response_latency_are_exported() -> None:
    above_all = len(_core.LatencyHistogram().counts) - 1
    decoupled = _core.StatisticsSnapshot(
        responses=11,
        first_response=_core.LatencyHistogram([2, 0, 0, 1] + [0] * (above_all - 3), 1_200_000),
    )
    metrics = InferenceMetrics(
        lambda: [
            ModelCounters("streamer", "1", decoupled, 0),
            ModelCounters("plain", "1", STATISTICS, 0),
        ],
        gpu=False,
    )
    values = samples(generate_latest(metrics.registry).decode())
    streamer = (("model", "streamer"), ("version", "1"))
    plain = (("model", "plain"), ("version", "1"))
    assert values[("inferd_responses_total", streamer)] == 11
    assert values[("inferd_responses_total", plain)] == 0
    first = "inferd_first_response_duration_us"
    assert values[(f"{first}_count", streamer)] == 3
    assert values[(f"{first}_sum", streamer)] == 1200
    assert values[(f"{first}_bucket", (("le", "100.0"), *streamer))] == 2
    assert values[(f"{first}_bucket", (("le", "1000.0"), *streamer))] == 3
    assert values[(f"{first}_count", plain)] == 0
