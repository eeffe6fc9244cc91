"""Batching settings that only show end to end, through a server subprocess and tritonclient:
preserve_ordering on a stream, the pad value and the slicing of padded outputs, the queue policies
of single priority levels, and the failure reasons of ``nv_inference_request_failure``.

Each test is built so that the setting decides its outcome: dropping the setting on its way to
the core (``inferd.repository.batching_config.batcher_options``) makes the test fail. Queueing
is made observable with the slow models of ``slow_model.py``: the ordering models' work scales
with the rows (about 10 ms a row at size 512 on one thread); the queue-policy and padding models
are long-row models, where ``occupy`` keeps the only instance busy for a long row's compute while
the requests under test, short rows, compute in milliseconds. The queue tests wait for the queue
they need (``nv_inference_pending_request_count``), never for time.
"""

from __future__ import annotations

import queue
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import ServerProcess, running_server
from tests.integration.gather_model import TABLE, write_gather_model
from tests.integration.slow_model import (
    fill_queue_of_one,
    fp32_input,
    occupy,
    write_long_row_model,
    write_slow_model,
)

ONE_THREAD = 'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
FIXED_IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
LONG_ROW_IO = FIXED_IO.replace("dims: [ 1 ]", "dims: [ -1 ]")

# Two instances, eight rows at most: an 8-row request fills a batch alone and computes for about
# 80 ms on one instance while 1-row requests (about 10 ms) go through the other.
ORDERING = (
    "max_batch_size: 8\n"
    + FIXED_IO
    + "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
    + ONE_THREAD
)

# A long-row model, one instance, one request per execution: the queue order is the execution
# order. Level 1 holds one request; level 2 rejects after 20 ms in the queue; level 3 lets a
# request shorten its 10 s timeout and, on a timeout, moves it behind its level instead of
# rejecting it; level 4, the default, has the default policy (unbounded, no timeout).
LEVELS = (
    "max_batch_size: 1\n"
    + LONG_ROW_IO
    + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    + ONE_THREAD
    + """
dynamic_batching {
  priority_levels: 4
  default_priority_level: 4
  priority_queue_policy { key: 1 value { max_queue_size: 1 } }
  priority_queue_policy { key: 2 value { default_timeout_microseconds: 20000 } }
  priority_queue_policy {
    key: 3
    value {
      default_timeout_microseconds: 10000000
      allow_timeout_override: true
      timeout_action: DELAY
    }
  }
}
"""
)

# The same long-row model with a queue of one, for the failure reasons.
BOUNDED = (
    "max_batch_size: 1\n"
    + LONG_ROW_IO
    + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    + ONE_THREAD
    + "dynamic_batching { default_queue_policy { max_queue_size: 1 } }\n"
)

# INPUT0 [batch, -1] padded with 2.5 to the longest of its batch; OUTPUT0 is cut back to each
# request's length, PADDED (the same values) is not, so it shows what the model was given.
PAD_VALUE = 2.5
PADDING = (
    "max_batch_size: 8\n"
    + """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "PADDED" data_type: TYPE_FP32 dims: [ -1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { }
parameters { key: "inferd.pad_inputs" value: { string_value: "INPUT0" } }
parameters { key: "inferd.pad_value" value: { string_value: "2.5" } }
parameters { key: "inferd.pad_outputs" value: { string_value: "OUTPUT0" } }
"""
    + ONE_THREAD
)

# For the gather model (tests/integration/gather_model.py): an index outside 0..3 is INTERNAL.
GATHER = """
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def write_padding_model(model_dir: Path) -> None:
    """The long-row identity (size 512) with a second output, PADDED, equal to OUTPUT0."""
    write_long_row_model(model_dir, PADDING, size=512)
    path = model_dir / "1" / "model.onnx"
    model = onnx.load(path)
    model.graph.node.append(helper.make_node("Identity", ["OUTPUT0"], ["PADDED"]))
    model.graph.output.append(
        helper.make_tensor_value_info("PADDED", TensorProto.FLOAT, ["batch", "length"])
    )
    onnx.save(model, path)


@pytest.fixture(scope="module")
def settings_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("batching_settings")
    repository = root / "models"
    write_slow_model(
        repository / "ordered",
        ORDERING + "dynamic_batching { preserve_ordering: true }\n",
        size=512,
    )
    write_slow_model(repository / "unordered", ORDERING + "dynamic_batching { }\n", size=512)
    write_long_row_model(repository / "levels", LEVELS)
    write_long_row_model(repository / "bounded", BOUNDED)
    write_padding_model(repository / "padded")
    names = ["bounded", "levels", "ordered", "padded", "unordered"]
    with running_server(repository, names, root) as server:
        yield server


def gather_failure_record(record: dict[str, object]) -> bool:
    """A log record of the gather model's failure: ONNX Runtime's own, or inferd's record of
    the INTERNAL answer."""
    event = str(record.get("event", ""))
    return ("Gather node" in event and record.get("logger") == "onnxruntime") or (
        record.get("model") == "gather"
    )


@pytest.fixture(scope="module")
def failing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server for the gather model, whose failure is logged at error level (ONNX Runtime logs a
    failed run as an error, and inferd its INTERNAL answer)."""
    root = tmp_path_factory.mktemp("batching_settings_failing")
    repository = root / "models"
    write_gather_model(repository / "gather", GATHER)
    with running_server(
        repository, ["gather"], root, expected_errors=gather_failure_record
    ) as server:
        yield server


@pytest.fixture
def triton(settings_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(settings_server.url)
    try:
        yield client
    finally:
        client.close()


def column(*values: float) -> np.ndarray:
    """[rows, 1] FP32."""
    return np.array(values, np.float32).reshape(-1, 1)


class Answers:
    """Collects async_infer callbacks: (tag, result or error), in completion order."""

    def __init__(self) -> None:
        self.done: queue.Queue[tuple[str, Any, Any]] = queue.Queue()

    def callback(self, tag: str) -> Callable[[Any, Any], None]:
        return lambda result, error: self.done.put((tag, result, error))

    def wait(self, count: int, timeout: float = 30.0) -> list[tuple[str, Any, Any]]:
        return [self.done.get(timeout=timeout) for _ in range(count)]


BUSY = {"busy0", "busy1"}  # occupy's two requests


def executions(client: grpcclient.InferenceServerClient, model: str) -> int:
    return int(client.get_inference_statistics(model).model_stats[0].execution_count)


# preserve_ordering


def stream_order(client: grpcclient.InferenceServerClient, model: str) -> list[str]:
    """Sends, on one stream, an 8-row request ("A", about 80 ms on one instance) and then three
    1-row ones ("B1".."B3", about 10 ms each on the other instance); returns the ids of the
    answers in the order they arrived, each checked."""
    sent = {"A": column(*range(1, 9))} | {f"B{i}": column(100.0 + i) for i in (1, 2, 3)}
    done: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: done.put((result, error)))
    try:
        for request_id, values in sent.items():
            client.async_stream_infer(model, fp32_input(values), request_id=request_id)
        order: list[str] = []
        for _ in sent:
            result, error = done.get(timeout=30)
            assert error is None, error
            request_id = result.get_response().id
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), sent[request_id])
            order.append(request_id)
    finally:
        client.stop_stream()
    return order


def test_without_preserve_ordering_later_requests_overtake_on_a_stream(
    triton: grpcclient.InferenceServerClient,
) -> None:
    """The control for the next test: on the same model without preserve_ordering, the 1-row
    requests finish first. Tried up to three times so that a stalled CPU cannot fail it."""
    orders: list[list[str]] = []
    for _ in range(3):
        orders.append(stream_order(triton, "unordered"))
        if orders[-1] != ["A", "B1", "B2", "B3"]:
            break
    assert orders[-1] != ["A", "B1", "B2", "B3"], orders


def test_preserve_ordering_answers_a_stream_in_request_order(
    triton: grpcclient.InferenceServerClient,
) -> None:
    # Three streams: on a loaded machine the 1-row requests now and then fail to overtake (about
    # 1 stream in 10 with two busy loops on two cores), and one stream would then not notice
    # that the setting is missing.
    for _ in range(3):
        assert stream_order(triton, "ordered") == ["A", "B1", "B2", "B3"]


# Padding


def test_padding_uses_the_pad_value_and_slices_it_off_again(
    settings_server: ServerProcess, triton: grpcclient.InferenceServerClient
) -> None:
    """A 1-row request of length 2 and a 2-row one of length 5 wait behind two busy batches and
    are computed together: the model sees the short row padded with 2.5 to length 5 (PADDED),
    and OUTPUT0 comes back cut to each request's own length."""
    before = executions(triton, "padded")
    answers = Answers()
    # Two 8-row busy batches (max_batch_size 8): they cannot share one.
    occupy(triton, settings_server, "padded", answers.callback, rows=8, length=2048)
    short = np.array([[1.0, -2.0]], np.float32)
    long = np.arange(10, dtype=np.float32).reshape(2, 5) - 4
    triton.async_infer("padded", fp32_input(short), answers.callback("short"))
    triton.async_infer("padded", fp32_input(long), answers.callback("long"))
    settings_server.wait_for_pending("padded", 3)
    results = {tag: (result, error) for tag, result, error in answers.wait(4)}
    assert all(error is None for _, error in results.values()), results
    # The two busy batches and one more: the two requests shared it.
    assert executions(triton, "padded") - before == 3, "the two requests did not share a batch"
    short_result, long_result = results["short"][0], results["long"][0]
    np.testing.assert_array_equal(short_result.as_numpy("OUTPUT0"), short)
    np.testing.assert_array_equal(
        short_result.as_numpy("PADDED"), np.array([[1.0, -2.0, PAD_VALUE, PAD_VALUE, PAD_VALUE]])
    )
    np.testing.assert_array_equal(long_result.as_numpy("OUTPUT0"), long)
    np.testing.assert_array_equal(long_result.as_numpy("PADDED"), long)


# Queue policies of single priority levels


def test_a_level_s_own_max_queue_size_refuses_while_the_default_level_queues(
    settings_server: ServerProcess, triton: grpcclient.InferenceServerClient
) -> None:
    answers = Answers()
    occupy(triton, settings_server, "levels", answers.callback)  # one busy request queued
    triton.async_infer("levels", fp32_input(column(1.0)), answers.callback("p1"), priority=1)
    settings_server.wait_for_pending("levels", 2)
    with pytest.raises(InferenceServerException) as refused:
        triton.infer("levels", fp32_input(column(2.0)), priority=1)
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "priority level 1 is full (max_queue_size 1)" in refused.value.message()
    for i in range(3):  # level 4, the default: no limit
        triton.async_infer("levels", fp32_input(column(10.0 + i)), answers.callback(f"d{i}"))
    results = answers.wait(6)
    assert [error for _, _, error in results] == [None] * 6, results
    # Level 1 first, then the busy request queued at level 4 before the three (sent at once,
    # they arrive in no defined order among themselves).
    tags = [tag for tag, _, _ in results]
    assert {tags[0], tags[2]} == BUSY and tags[1] == "p1", tags
    assert sorted(tags[3:]) == ["d0", "d1", "d2"], tags


def test_a_level_s_own_timeout_rejects_while_the_default_level_waits(
    settings_server: ServerProcess, triton: grpcclient.InferenceServerClient
) -> None:
    answers = Answers()
    occupy(triton, settings_server, "levels", answers.callback)
    triton.async_infer("levels", fp32_input(column(1.0)), answers.callback("p2"), priority=2)
    triton.async_infer("levels", fp32_input(column(2.0)), answers.callback("default"))
    results = {tag: error for tag, _, error in answers.wait(4)}
    assert results["busy0"] is None and results["busy1"] is None, results
    # Queued behind a whole busy request (far longer than 20 ms), under no timeout.
    assert results["default"] is None
    assert isinstance(results["p2"], InferenceServerException), results
    assert results["p2"].status() == "StatusCode.UNAVAILABLE"
    assert "timeout" in results["p2"].message()


def test_a_level_s_delay_action_moves_a_timed_out_request_behind_its_level(
    settings_server: ServerProcess, triton: grpcclient.InferenceServerClient
) -> None:
    """Level 3: "late" asks for a 5 ms timeout (overriding 10 s) and, on it, is moved behind
    the level's queue, so "next", queued after it, is computed first; neither is rejected. Both
    wait behind a whole busy request, far longer than 5 ms: the batcher sees late's timeout
    before it takes either (it expires requests before it forms each batch)."""
    answers = Answers()
    occupy(triton, settings_server, "levels", answers.callback)
    triton.async_infer(
        "levels", fp32_input(column(1.0)), answers.callback("late"), priority=3, timeout=5000
    )
    settings_server.wait_for_pending("levels", 2)
    triton.async_infer("levels", fp32_input(column(2.0)), answers.callback("next"), priority=3)
    settings_server.wait_for_pending("levels", 3)
    results = answers.wait(4)
    assert [error for _, _, error in results] == [None] * 4, results
    tags = [tag for tag, _, _ in results]
    assert tags[0] in BUSY and tags[1:3] == ["next", "late"] and tags[3] in BUSY, tags


# Failure reasons in the metrics


def failures(server: ServerProcess, model: str) -> dict[str, float]:
    """``nv_inference_request_failure`` of the model's version 1, by reason."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "nv_inference_request_failure":
            for s in family.samples:
                if s.labels.get("model") == model and s.labels.get("version") == "1":
                    counts[s.labels["reason"]] = float(s.value)
    assert set(counts) == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}, counts
    return counts


def expect_one_more(
    server: ServerProcess, model: str, before: dict[str, float], reason: str
) -> None:
    """Waits (the count may follow the client's answer) until the model's failures are
    ``before`` with one more ``reason``."""
    expected = before | {reason: before[reason] + 1}
    deadline = time.monotonic() + 10
    while (now := failures(server, model)) != expected:
        if time.monotonic() > deadline:
            pytest.fail(f"failures of {model}: {now}, expected {expected}")
        time.sleep(0.02)  # the poll's period


def test_a_full_queue_counts_as_rejected(
    settings_server: ServerProcess, triton: grpcclient.InferenceServerClient
) -> None:
    answers = Answers()
    fill_queue_of_one(triton, settings_server, "bounded", answers.callback)
    before = failures(settings_server, "bounded")  # after the refusals filling it may have met
    with pytest.raises(InferenceServerException) as refused:
        triton.infer("bounded", fp32_input(column(2.0)))
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert [error for _, _, error in answers.wait(2)] == [None, None]
    expect_one_more(settings_server, "bounded", before, "REJECTED")


def test_a_cancelled_request_counts_as_canceled(
    settings_server: ServerProcess, triton: grpcclient.InferenceServerClient
) -> None:
    """On levels' default level (no limit: occupy fills bounded's queue of one)."""
    before = failures(settings_server, "levels")
    answers = Answers()
    occupy(triton, settings_server, "levels", answers.callback)
    call = triton.async_infer("levels", fp32_input(column(1.0)), answers.callback("cancelled"))
    settings_server.wait_for_pending("levels", 2)  # queued behind a whole busy request
    call.cancel()
    results = {tag: error for tag, _, error in answers.wait(3)}
    assert results["busy0"] is None and results["busy1"] is None, results
    assert isinstance(results["cancelled"], InferenceServerException), results
    expect_one_more(settings_server, "levels", before, "CANCELED")


def test_an_executor_failure_counts_as_backend(failing_server: ServerProcess) -> None:
    def gather(client: grpcclient.InferenceServerClient, index: int) -> Any:
        tensor = grpcclient.InferInput("INPUT0", [1, 1], "INT64")
        tensor.set_data_from_numpy(np.array([[index]], np.int64))
        return client.infer("gather", [tensor])

    before = failures(failing_server, "gather")
    with grpcclient.InferenceServerClient(failing_server.url) as client:
        np.testing.assert_array_equal(gather(client, 2).as_numpy("OUTPUT0"), [[TABLE[2]]])
        with pytest.raises(InferenceServerException) as failed:
            gather(client, len(TABLE) + 6)
    assert failed.value.status() == "StatusCode.INTERNAL"
    expect_one_more(failing_server, "gather", before, "BACKEND")
