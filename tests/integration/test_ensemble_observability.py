"""Ensembles observed like models (issue 16, item 3), through a real server: a traced ensemble
request's ``ensemble`` span with a ``step`` child per step, each linked from the batch span of the
composing model it rode in (shared with direct traffic to that model), exported over OTLP to a
real receiver; and the metrics: the ensemble's own counts, each step's, and the composing models'
counts including the ensemble's steps. The models are in ensemble_models.py."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import ServerProcess, running_server
from tests.integration.ensemble_models import (
    GATHER_CONFIG,
    LOOKUP,
    WIDTH,
    slow_chain_config,
    write_base,
    write_elementwise_model,
    write_ensemble,
    write_slow,
)
from tests.integration.gather_model import write_gather_model
from tests.integration.otlp_receiver import OtlpTraceReceiver
from tests.integration.test_observability import attributes, traceparent

BAD_INDEX = 987654321  # outside gather's table: ONNX Runtime fails the lookup's gather step


def caused_here(record: dict[str, object]) -> bool:
    """The error records of the lookup whose gather step fails on purpose."""
    return record.get("model") in ("gather", "lookup") or record.get("logger") == "onnxruntime"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpTraceReceiver]:
    otlp = OtlpTraceReceiver()
    yield otlp
    otlp.stop()


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpTraceReceiver
) -> Iterator[ServerProcess]:
    """pre, left, right, combine with the diamond and chain ensembles; gather and double1 with
    the lookup ensemble; slow with slow_chain (pre -> slow). Every request traced."""
    root = tmp_path_factory.mktemp("ensemble-observability")
    repository = root / "models"
    names = write_base(repository)
    write_gather_model(repository / "gather", GATHER_CONFIG)
    write_elementwise_model(repository / "double1", "double", ("X",), "Y", width=1)
    write_ensemble(repository / "lookup", LOOKUP)
    write_slow(repository / "slow")
    write_ensemble(repository / "slow_chain", slow_chain_config("slow_chain", "slow"))
    names += ["gather", "double1", "lookup", "slow", "slow_chain"]
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export quickly: the tests wait for the spans
    }
    with running_server(
        repository, names, root, env_extra=env, expected_errors=caused_here
    ) as process:
        yield process


def fp32(name: str, values: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return tensor


def row(value: float, rows: int = 1) -> np.ndarray:
    return np.full((rows, WIDTH), value, dtype=np.float32)


def children_of(spans: list[Any], parent: Any) -> list[Any]:
    return [s for s in spans if s.parent_span_id == parent.span_id]


def wait_for_span(receiver: OtlpTraceReceiver, found: Any, timeout_s: float = 20.0) -> Any:
    """The first exported span for which ``found(span)`` holds; fails past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        for span in receiver.spans():
            if found(span):
                return span
        assert time.monotonic() < deadline, "the span did not arrive"
        time.sleep(0.05)  # the poll's period


def linking_batch(receiver: OtlpTraceReceiver, span: Any) -> Any:
    """The batch span that links ``span``."""
    return wait_for_span(
        receiver,
        lambda s: s.name == "batch" and any(link.span_id == span.span_id for link in s.links),
    )


def test_a_traced_ensemble_request_has_a_step_span_per_step_linked_to_its_batch(
    server: ServerProcess, receiver: OtlpTraceReceiver
) -> None:
    header, trace_id, _ = traceparent()
    with grpcclient.InferenceServerClient(server.url) as client:
        client.infer("diamond", [fp32("IN", row(1.0, rows=2))], headers={"traceparent": header})
    request = wait_for_span(
        receiver, lambda s: s.name == "ModelInfer" and s.trace_id.hex() == trace_id
    )
    assert attributes(request)["inferd.model"] == "diamond"

    def ensemble_found(span: Any) -> bool:
        return bool(span.name == "ensemble" and span.parent_span_id == request.span_id)

    ensemble = wait_for_span(receiver, ensemble_found)
    assert attributes(ensemble) == {
        "inferd.model": "diamond",
        "inferd.model_version": "1",
        "inferd.ensemble_steps": 4,
    }
    assert request.start_time_unix_nano <= ensemble.start_time_unix_nano
    assert ensemble.end_time_unix_nano <= request.end_time_unix_nano
    spans = receiver.spans()
    steps = {attributes(s)["inferd.step"]: s for s in children_of(spans, ensemble)}
    assert all(s.name == "step" for s in steps.values())
    # The config lists combine first; pre feeds left and right, which combine adds.
    models = {index: attributes(s)["inferd.model"] for index, s in steps.items()}
    assert models == {0: "combine", 1: "pre", 2: "left", 3: "right"}
    for index, step in steps.items():
        mine = attributes(step)
        assert mine["inferd.model_version"] == "1"
        assert step.trace_id == request.trace_id
        assert ensemble.start_time_unix_nano <= step.start_time_unix_nano
        assert step.end_time_unix_nano <= ensemble.end_time_unix_nano
        queue, compute = sorted(
            children_of(receiver.spans(), step), key=lambda s: s.start_time_unix_nano
        )
        assert (queue.name, compute.name) == ("queue", "compute")
        assert step.start_time_unix_nano <= queue.start_time_unix_nano
        assert compute.end_time_unix_nano <= step.end_time_unix_nano
        batch = attributes(linking_batch(receiver, step))
        assert (batch["inferd.model"], batch["inferd.model_version"]) == (models[index], "1")
        assert batch["inferd.batch_id"] == mine["inferd.batch_id"]
        assert batch["inferd.batch_size"] == 2  # the request's two rows
    # The dataflow: pre answered before left and right were submitted; combine after both.
    for consumer in (2, 3):
        assert steps[1].end_time_unix_nano <= steps[consumer].start_time_unix_nano
        assert steps[consumer].end_time_unix_nano <= steps[0].start_time_unix_nano


def test_a_step_and_a_direct_request_in_one_batch_are_linked_from_one_batch_span(
    server: ServerProcess, receiver: OtlpTraceReceiver
) -> None:
    # slow computes about 100 ms a row on one instance, eight rows a batch at most. Two 8-row
    # requests cannot share a batch: one computes while the other waits queued, whichever came
    # first; a slow_chain request's slow step and a direct request to slow queue behind them (3
    # pending) and share the batch after theirs.
    headers = {name: traceparent() for name in ("busy0", "busy1", "ensemble", "direct")}
    errors: list[BaseException] = []

    def call(name: str, model: str, tensor: grpcclient.InferInput) -> None:
        try:
            with grpcclient.InferenceServerClient(server.url) as client:
                client.infer(model, [tensor], headers={"traceparent": headers[name][0]})
        except BaseException as e:
            errors.append(e)

    busy = [
        threading.Thread(target=call, args=(name, "slow", fp32("INPUT0", row(1.0, 8))))
        for name in ("busy0", "busy1")
    ]
    for thread in busy:
        thread.start()
    server.wait_for_pending("slow", 1)
    others = [
        threading.Thread(target=call, args=("ensemble", "slow_chain", fp32("IN", row(2.0)))),
        threading.Thread(target=call, args=("direct", "slow", fp32("INPUT0", row(3.0)))),
    ]
    for thread in others:
        thread.start()
    server.wait_for_pending("slow", 3)
    for thread in [*busy, *others]:
        thread.join()
    assert errors == []
    direct = wait_for_span(
        receiver,
        lambda s: s.name == "ModelInfer" and s.trace_id.hex() == headers["direct"][1],
    )
    step = wait_for_span(
        receiver,
        lambda s: (
            s.name == "step"
            and s.trace_id.hex() == headers["ensemble"][1]
            and attributes(s)["inferd.model"] == "slow"
        ),
    )
    batch = linking_batch(receiver, direct)
    assert attributes(batch)["inferd.model"] == "slow"
    assert step.span_id in {link.span_id for link in batch.links}
    assert attributes(step)["inferd.batch_id"] == attributes(direct)["inferd.batch_id"]


def scrape(server: ServerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(families: dict[str, Any], name: str, suffix: str = "", **labels: str) -> float:
    values = [
        s.value
        for s in families[name].samples
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(values) == 1, f"{name}{suffix} {labels}: {values}"
    return float(values[0])


STEP_REQUESTS = "inferd_ensemble_step_requests"
STEP_DURATION = "inferd_ensemble_step_duration_us"


def test_metrics_count_the_ensemble_each_step_and_the_steps_in_their_models(
    server: ServerProcess,
) -> None:
    before = scrape(server)
    with grpcclient.InferenceServerClient(server.url) as client:
        for value in range(5):
            client.infer("chain", [fp32("IN", row(float(value), rows=2))])
        for value in range(3):
            client.infer("pre", [fp32("RAW", row(float(value)))])
        bad = grpcclient.InferInput("INDEX", [1, 1], "INT64")
        bad.set_data_from_numpy(np.array([[BAD_INDEX]], dtype=np.int64))
        with pytest.raises(InferenceServerException, match=r"step 1 \(model 'gather'\)"):
            client.infer("lookup", [bad])
    after = scrape(server)

    def grew(name: str, suffix: str = "", **labels: str) -> float:
        return sample(after, name, suffix, **labels) - sample(before, name, suffix, **labels)

    chain = {"model": "chain", "version": "1"}
    # The ensemble's own figures, a model's families: one execution per request.
    assert grew("nv_inference_request_success", **chain) == 5
    assert grew("nv_inference_count", **chain) == 10
    assert grew("nv_inference_exec_count", **chain) == 5
    assert grew("nv_inference_request_duration_us", **chain) > 0
    assert grew("inferd_request_duration_us", "_count", **chain) == 5
    # Each step's, by outcome.
    for index, model in enumerate(("pre", "left", "right")):
        labels = {"model": "chain", "step": str(index), "step_model": model}
        assert grew(STEP_REQUESTS, "_total", outcome="success", version="1", **labels) == 5
        assert grew(STEP_REQUESTS, "_total", outcome="fail", version="1", **labels) == 0
        assert grew(STEP_DURATION, "_total", outcome="success", version="1", **labels) > 0
    # The composing models count the ensemble's steps with their direct traffic.
    assert grew("nv_inference_request_success", model="pre", version="1") == 5 + 3
    assert grew("nv_inference_request_success", model="left", version="1") == 5
    assert grew("nv_inference_count", model="left", version="1") == 10
    # lookup's failing step: gather (step 1) failed once; double1 (step 0) never ran.
    lookup = {"model": "lookup", "version": "1"}
    gather = {"step": "1", "step_model": "gather", "version": "1"}
    assert grew(STEP_REQUESTS, "_total", outcome="fail", model="lookup", **gather) == 1
    assert grew(STEP_REQUESTS, "_total", outcome="success", model="lookup", **gather) == 0
    assert grew(STEP_DURATION, "_total", outcome="fail", model="lookup", **gather) > 0
    double1 = {"step": "0", "step_model": "double1", "version": "1", "model": "lookup"}
    for outcome in ("success", "fail"):
        assert grew(STEP_REQUESTS, "_total", outcome=outcome, **double1) == 0
    assert grew("nv_inference_request_failure", reason="BACKEND", **lookup) == 1
    # A plain model has no step series; the diamond's are there, each of its four steps.
    steps = {
        (s.labels["model"], s.labels["step"])
        for s in after[STEP_REQUESTS].samples
        if s.name == STEP_REQUESTS + "_total"
    }
    assert {model for model, _ in steps} == {"diamond", "chain", "lookup", "slow_chain"}
    assert {step for model, step in steps if model == "diamond"} == {"0", "1", "2", "3"}
