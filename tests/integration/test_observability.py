"""Traces exported over OTLP to a real receiver, metrics scraped over HTTP, health watched through
load, unload and shutdown, and run-time log settings, all against a server subprocess."""

from __future__ import annotations

import secrets
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from inferd.examples import make_examples
from tests.integration.conftest import ServerProcess, running_server
from tests.integration.otlp_receiver import OtlpTraceReceiver
from tests.integration.slow_model import write_slow_model

SERVICE = "inference.GRPCInferenceService"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpTraceReceiver]:
    otlp = OtlpTraceReceiver()
    yield otlp
    otlp.stop()


@pytest.fixture(scope="module")
def traced_server(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpTraceReceiver
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("observability")
    repository = root / "models"
    names = make_examples(repository)
    # About 10 ms a row on one thread, and up to 20 ms of queue delay: requests that arrive while
    # one computes share the next batch.
    write_slow_model(repository / "slow", LINKED_MODEL_CONFIG, size=512)
    names.append("slow")
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export quickly: the test waits for the spans
        "OTEL_SERVICE_NAME": "inferd-under-test",
    }
    with running_server(repository, names, root, env_extra=env) as server:
        yield server


LINKED_MODEL_CONFIG = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""


def slow_request(value: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.float32))
    return [tensor]


def simple_request(value: int) -> list[grpcclient.InferInput]:
    data = np.full((1, 16), value, dtype=np.int32)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    return inputs


def traceparent() -> tuple[str, str, str]:
    """A caller's W3C traceparent header, with its trace id and span id (hex)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def test_each_request_continues_the_callers_trace_and_its_batch_links_it(
    traced_server: ServerProcess, receiver: OtlpTraceReceiver
) -> None:
    callers: dict[str, str] = {}  # trace id -> the caller's span id
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def call(index: int) -> None:
        header, trace_id, span_id = traceparent()
        callers[trace_id] = span_id
        try:
            with grpcclient.InferenceServerClient(traced_server.url) as client:
                start.wait()
                client.infer("slow", slow_request(index), headers={"traceparent": header})
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

    requests = [
        s
        for s in receiver.wait_for(8, "ModelInfer")
        if s.trace_id.hex() in callers and attributes(s).get("inferd.model") == "slow"
    ]
    assert len(requests) == 8
    by_parent: dict[bytes, list[Any]] = {}
    for span in receiver.spans():
        by_parent.setdefault(span.parent_span_id, []).append(span)
    linked: dict[bytes, Any] = {}
    for batch in receiver.wait_for(1, "batch"):
        for link in batch.links:
            linked[link.span_id] = batch
    for span in requests:
        # The caller's trace goes on: same trace id, the caller's span as parent.
        assert span.parent_span_id.hex() == callers[span.trace_id.hex()]
        assert span.kind == span.SPAN_KIND_SERVER
        children = {c.name: c for c in by_parent.get(span.span_id, [])}
        assert set(children) == {"queue", "compute"}, children.keys()
        assert all(c.trace_id == span.trace_id for c in children.values())
        queue, compute = children["queue"], children["compute"]
        assert queue.end_time_unix_nano <= compute.start_time_unix_nano + 1000
        assert span.start_time_unix_nano <= queue.start_time_unix_nano
        assert compute.end_time_unix_nano <= span.end_time_unix_nano
        # The batch it rode in links it, and agrees on which batch that was.
        found = receiver.wait_for(1, "batch")
        batch = linked.get(span.span_id) or next(
            (b for b in found if any(link.span_id == span.span_id for link in b.links)), None
        )
        assert batch is not None, "no batch span links this request"
        mine, theirs = attributes(span), attributes(batch)
        assert mine["inferd.batch_id"] == theirs["inferd.batch_id"]
        assert theirs["inferd.model"] == "slow" and theirs["inferd.model_version"] == "1"
        assert theirs["inferd.batch_requests"] == len(batch.links)
        assert theirs["inferd.batch_size"] >= 1 and "inferd.instance" in theirs
        assert mine["inferd.queue_us"] >= 0
    batch_sizes = [len(b.links) for b in {id(b): b for b in linked.values()}.values()]
    assert max(batch_sizes) > 1, f"8 concurrent requests, 20 ms delay, batches {batch_sizes}"


def test_a_decoupled_models_streamed_request_is_traced_with_its_responses(
    traced_server: ServerProcess, receiver: OtlpTraceReceiver
) -> None:
    # The core runs it (a decoupled request never goes to Python) and reports it once ended: its
    # span continues the caller's trace and counts the responses the client read.
    header, trace_id, span_id = traceparent()
    answers: list[Any] = []

    def received(result: Any, error: Any) -> None:
        answers.append(error if error is not None else result)

    prompt = grpcclient.InferInput("PROMPT", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"one two three four"], dtype=np.object_))
    count = grpcclient.InferInput("MAX_TOKENS", [1], "INT32")
    count.set_data_from_numpy(np.array([3], dtype=np.int32))
    with grpcclient.InferenceServerClient(traced_server.url) as client:
        client.start_stream(callback=received, headers={"traceparent": header})
        client.async_stream_infer("generate", [prompt, count], request_id="g1")
        client.stop_stream()  # returns once the server ended the stream: every answer is in
    assert answers and not any(isinstance(a, InferenceServerException) for a in answers), answers
    deadline = time.monotonic() + 20
    while True:
        spans = [
            s for s in receiver.spans() if s.name == "ModelInfer" and s.trace_id.hex() == trace_id
        ]
        if spans or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    [span] = spans
    assert span.parent_span_id.hex() == span_id
    found = attributes(span)
    assert found["inferd.model"] == "generate" and found["inferd.model_version"] == "1"
    assert found["inferd.responses"] == len(answers)
    names = {s.name for s in receiver.spans() if s.parent_span_id == span.span_id}
    assert names == {"queue", "compute"}


def test_a_request_without_traceparent_starts_a_new_trace(
    traced_server: ServerProcess, receiver: OtlpTraceReceiver
) -> None:
    before = {s.span_id for s in receiver.spans()}
    with grpcclient.InferenceServerClient(traced_server.url) as client:
        client.infer("simple", simple_request(1))

    def new_roots() -> list[Any]:
        return [
            s
            for s in receiver.spans()
            if s.name == "ModelInfer" and s.span_id not in before and s.parent_span_id == b""
        ]

    wait_until(lambda: len(new_roots()) == 1)


def scrape(server: ServerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(families: dict[str, Any], name: str, suffix: str = "", **labels: str) -> float:
    family = families[name]
    values = [
        s.value
        for s in family.samples
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(values) == 1, f"{name}{suffix} {labels}: {values}"
    return float(values[0])


def test_metrics_count_what_was_sent(traced_server: ServerProcess) -> None:
    model = {"model": "identity_fp32", "version": "1"}
    with grpcclient.InferenceServerClient(traced_server.url) as client:
        for rows in (1, 2, 3) * 5:  # 15 requests, 30 rows
            tensor = grpcclient.InferInput("INPUT0", [rows, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((rows, 4), dtype=np.float32))
            client.infer("identity_fp32", [tensor])
        for _ in range(3):
            bad = grpcclient.InferInput("INPUT0", [1, 4], "INT32")  # wrong datatype
            bad.set_data_from_numpy(np.ones((1, 4), dtype=np.int32))
            with pytest.raises(InferenceServerException):
                client.infer("identity_fp32", [bad])
    families = scrape(traced_server)
    assert sample(families, "nv_inference_request_success", **model) == 15
    assert sample(families, "nv_inference_count", **model) == 30
    executions = sample(families, "nv_inference_exec_count", **model)
    assert 1 <= executions <= 15
    assert sample(families, "nv_inference_request_failure", reason="OTHER", **model) == 3
    assert sample(families, "nv_inference_queue_duration_us", **model) >= 0
    assert sample(families, "nv_inference_compute_infer_duration_us", **model) > 0
    assert sample(families, "nv_inference_pending_request_count", **model) == 0
    # The core's histogram: the 15 it computed (the 3 refused never reached its queue).
    assert sample(families, "inferd_request_duration_us", "_count", **model) == 15
    assert sample(families, "inferd_queue_duration_us", "_count", **model) == 15
    assert sample(families, "inferd_batch_size", "_count", **model) == executions
    assert sample(families, "inferd_batch_size", "_sum", **model) == 30
    # The same counters answer ModelStatistics.
    with grpcclient.InferenceServerClient(traced_server.url) as client:
        stats = client.get_inference_statistics("identity_fp32", "1").model_stats[0]
    assert stats.inference_stats.success.count == 15
    assert stats.execution_count == executions


def test_log_settings_change_at_run_time_and_verbose_lines_carry_the_trace(
    traced_server: ServerProcess,
) -> None:
    with grpcclient.InferenceServerClient(traced_server.url) as client:
        settings = client.update_log_settings({"log_verbose_level": 1}, as_json=True)["settings"]
        assert settings["log_verbose_level"] == {"uint32_param": 1}
        header, trace_id, _ = traceparent()
        client.infer("simple", simple_request(7), headers={"traceparent": header})
        client.update_log_settings({"log_verbose_level": 0})
        lines = [r for r in traced_server.records() if r.get("event") == "inference"]
        assert any(r.get("trace_id") == trace_id and r.get("outcome") == "OK" for r in lines)
        quiet = len(lines)
        client.infer("simple", simple_request(8))
        assert len([r for r in traced_server.records() if r.get("event") == "inference"]) == quiet
        off = client.update_log_settings({"log_info": False}, as_json=True)["settings"]
        assert off["log_info"] == {"bool_param": False}
        assert off["log_warning"] == {"bool_param": True}
        client.update_log_settings({"log_info": True})
        with pytest.raises(InferenceServerException, match="unknown log setting 'log_colour'"):
            client.update_log_settings({"log_colour": True})


def watch(url: str, service: str, seen: list[str], ready: threading.Event) -> None:
    """Appends each status ``Watch`` streams for ``service`` until the stream ends."""
    with grpc.insecure_channel(url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            for response in stub.Watch(health_pb2.HealthCheckRequest(service=service)):
                seen.append(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))
                ready.set()
        except grpc.RpcError:
            pass  # the server went away: the watch is over


def test_health_follows_load_unload_and_shutdown(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    names = make_examples(repository)
    statuses: dict[str, list[str]] = {"": [], f"{SERVICE}/identity_fp32": []}
    watchers: list[threading.Thread] = []
    with running_server(
        repository,
        names,
        tmp_path,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "simple",
    ) as server:
        for service, seen in statuses.items():
            ready = threading.Event()
            thread = threading.Thread(target=watch, args=(server.url, service, seen, ready))
            thread.start()
            assert ready.wait(10)
            watchers.append(thread)
        with grpcclient.InferenceServerClient(server.url) as client:
            client.load_model("identity_fp32")
            wait_until(lambda: statuses[f"{SERVICE}/identity_fp32"][-1:] == ["SERVING"])
            client.unload_model("identity_fp32")
            wait_until(lambda: statuses[f"{SERVICE}/identity_fp32"][-1:] == ["NOT_SERVING"])
            client.load_model("identity_fp32")
            wait_until(lambda: statuses[f"{SERVICE}/identity_fp32"][-1:] == ["SERVING"])
    for thread in watchers:
        thread.join(10)
    assert statuses[""] == ["SERVING", "NOT_SERVING"]  # ready, then shutting down
    model_statuses = statuses[f"{SERVICE}/identity_fp32"]
    if model_statuses[1:2] == ["NOT_SERVING"]:
        # The first load's LOADING state, when the health update caught it (a quick load may be
        # SERVING by the time the statuses are recomputed).
        del model_statuses[1]
    assert model_statuses == [
        "SERVICE_UNKNOWN",  # not loaded yet: no status
        "SERVING",
        "NOT_SERVING",
        "SERVING",
        "NOT_SERVING",  # shutdown
    ]


def wait_until(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the status did not change in time"
        time.sleep(0.02)  # the poll's period


def test_the_core_traces_exactly_the_requests_the_sampler_picks(
    tmp_path: Path, receiver: OtlpTraceReceiver
) -> None:
    """parentbased_traceidratio at 0.5: the core sends a request to Python to be traced when the
    caller's parent was sampled, never when it was not, and half of the new traces (one draw, in
    the core: Python records what the core picked rather than drawing again, which would make it
    a quarter). Unary and streamed alike. That the others never reach Python is checked where the
    transport can be watched (cpp/tests/grpc_server_test.cpp)."""
    repository = tmp_path / "models"
    names = make_examples(repository)
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.5",
    }
    roots = 300
    with running_server(repository, names, tmp_path, env_extra=env) as server:
        before = {s.span_id for s in receiver.spans()}
        sampled: list[str] = []
        unsampled: list[str] = []
        with grpcclient.InferenceServerClient(server.url) as client:
            for i in range(40):
                header, trace_id, _ = traceparent()
                if i % 2:
                    header = header[:-2] + "00"
                    unsampled.append(trace_id)
                else:
                    sampled.append(trace_id)
                client.infer("simple", simple_request(i), headers={"traceparent": header})
            for i in range(roots):
                client.infer("simple", simple_request(i))
            # A stream with a sampled parent, then one with an unsampled parent.
            streamed: list[Any] = []
            done = threading.Semaphore(0)

            def on_result(result: Any, error: Any) -> None:
                streamed.append(error or result)
                done.release()

            for flags in ("01", "00"):
                header, trace_id, _ = traceparent()
                (sampled if flags == "01" else unsampled).append(trace_id)
                client.start_stream(on_result, headers={"traceparent": header[:-2] + flags})
                for i in range(5):
                    client.async_stream_infer("simple", simple_request(i))
                for _ in range(5):
                    assert done.acquire(timeout=10)
                client.stop_stream()
            assert not [r for r in streamed if isinstance(r, InferenceServerException)]
            stats = client.get_inference_statistics("simple").model_stats[0]
            assert stats.inference_stats.success.count == 40 + roots + 10

        def requests() -> list[Any]:
            return [
                s for s in receiver.spans() if s.name == "ModelInfer" and s.span_id not in before
            ]

        # One more sampled request, after all the others: the exporter sends spans in the order
        # they ended, so once its span is in, every span of the requests above is in too.
        header, last, _ = traceparent()
        with grpcclient.InferenceServerClient(server.url) as client:
            client.infer("simple", simple_request(0), headers={"traceparent": header})
        wait_until(lambda: any(s.trace_id.hex() == last for s in requests()))
        assert {s.trace_id.hex() for s in requests()} >= set(sampled)
        spans = [s for s in requests() if s.trace_id.hex() != last]
    traced = [s.trace_id.hex() for s in spans if s.parent_span_id != b""]
    assert sorted(set(traced)) == sorted(sampled)
    assert len(traced) == 20 + 5  # each sampled request once; the stream's five share its trace
    assert not set(traced) & set(unsampled)
    new_traces = [s for s in spans if s.parent_span_id == b""]
    # 150 expected, standard deviation 8.7: 110..190 is over 4.5 of them either way (a second
    # draw in Python would give 75).
    assert 110 <= len(new_traces) <= 190, len(new_traces)
    for span in spans:
        assert "inferd.trace_sampled" not in attributes(span)
