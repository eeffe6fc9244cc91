"""Dynamic batching through a live server and tritonclient: batched rows come back to their own
callers, and the queue policies (priority, queue size, timeouts, deadlines, cancellation) hold.

Queueing is made observable with deliberately slow models served by one instance, so later
requests wait behind them: the queue-policy models (``slow_model.write_long_row_model``) compute a
busy request's long row for over half a second while the requests under test, one short row each,
compute in milliseconds; ``slow_batched`` computes about 100 ms a row (four 1024x1024 matrix
products). Every test waits for the queue it needs (``nv_inference_pending_request_count``) and
for the statistics it counts, never for time. The batching tests use lighter models (256x256,
about 1.5 ms a row): a burst then arrives faster than requests are served one by one, which is
when the batcher waits for company (max_queue_delay_microseconds is an upper bound: requests a
model serves as fast as they come are not held for company).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import ServerProcess, running_server, wait_until
from tests.integration.slow_model import (
    BUSY_LENGTH,
    fp32_input,
    occupy,
    write_long_row_model,
    write_slow_model,
)

SLOW_IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""
LONG_ROW_IO = SLOW_IO.replace("dims: [ 1 ]", "dims: [ -1 ]")

# Long-row models, max_batch_size 1: one request per execution, so the queue order is the
# execution order.
QUEUE_POLICY_MODELS: dict[str, str] = {
    "slow_priority": "max_batch_size: 1\n"
    + LONG_ROW_IO
    + "dynamic_batching { priority_levels: 2 default_priority_level: 2 }",
    "slow_bounded": "max_batch_size: 1\n"
    + LONG_ROW_IO
    + "dynamic_batching { default_queue_policy { max_queue_size: 2 } }",
    "slow_timeout": "max_batch_size: 1\n"
    + LONG_ROW_IO
    + "dynamic_batching { default_queue_policy { default_timeout_microseconds: 20000 } }",
    "slow_override": "max_batch_size: 1\n"
    + LONG_ROW_IO
    + "dynamic_batching { default_queue_policy {"
    " default_timeout_microseconds: 60000000 allow_timeout_override: true } }",
}
SLOW_BATCHED = (
    "max_batch_size: 16\n" + SLOW_IO + "dynamic_batching { max_queue_delay_microseconds: 2000 }"
)


# Light slow models of any length (the padding test pads INPUT0 with -7 and slices OUTPUT0 back).
LIGHT_SIZE = 256
LIGHT_IO = """
max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""
PADDED = """
parameters { key: "inferd.pad_inputs" value: { string_value: "INPUT0" } }
parameters { key: "inferd.pad_value" value: { string_value: "-7" } }
parameters { key: "inferd.pad_outputs" value: { string_value: "OUTPUT0" } }
"""


@pytest.fixture(scope="module")
def batching_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("batching")
    repository = root / "models"
    for name, config in QUEUE_POLICY_MODELS.items():
        write_long_row_model(repository / name, config)
    write_slow_model(repository / "slow_batched", SLOW_BATCHED)
    write_slow_model(repository / "batched_identity", LIGHT_IO, LIGHT_SIZE, "length")
    write_slow_model(repository / "padded_identity", LIGHT_IO + PADDED, LIGHT_SIZE, "length")
    models = [*QUEUE_POLICY_MODELS, "slow_batched", "batched_identity", "padded_identity"]
    with running_server(repository, models, root) as server:
        yield server


@pytest.fixture
def triton(batching_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(batching_server.url)
    try:
        yield client
    finally:
        client.close()


class Answers:
    """Collects async_infer callbacks: (tag, result or error), in completion order."""

    def __init__(self) -> None:
        self.done: queue.Queue[tuple[str, Any, Any]] = queue.Queue()

    def callback(self, tag: str) -> Any:
        return lambda result, error: self.done.put((tag, result, error))

    def wait(self, count: int, timeout: float = 30.0) -> list[tuple[str, Any, Any]]:
        return [self.done.get(timeout=timeout) for _ in range(count)]


def stats(client: grpcclient.InferenceServerClient, model: str) -> Any:
    return client.get_inference_statistics(model).model_stats[0]


def one_row(value: float) -> list[grpcclient.InferInput]:
    return fp32_input(np.array([[value]], np.float32))


def wait_for_inferences(
    client: grpcclient.InferenceServerClient, model: str, before: Any, count: int
) -> Any:
    """The model's statistics once at least ``count`` more inferences than ``before`` are
    counted (they may follow the answers)."""
    wait_until(
        lambda: stats(client, model).inference_count - before.inference_count >= count,
        f"{count} more inferences of {model}",
    )
    return stats(client, model)


def fill_two_batches(
    client: grpcclient.InferenceServerClient, server: ServerProcess, answers: Answers
) -> None:
    """Two full batches of slow_batched (16 rows each, over a second of compute each): one
    computes while the other waits queued, whichever a loaded machine delivered first, and the
    wait for it has that long to see it. A request sent next queues behind a whole batch."""
    assert client.is_server_live()
    full = np.full((16, 1), -1.0, np.float32)
    for tag in ("busy", "queued"):
        client.async_infer("slow_batched", fp32_input(full), answers.callback(tag))
    server.wait_for_pending("slow_batched", 1)


def test_concurrent_clients_get_their_own_rows_from_shared_batches(
    triton: grpcclient.InferenceServerClient,
) -> None:
    before = stats(triton, "batched_identity")
    answers = Answers()
    rng = np.random.default_rng(1)
    sent: dict[str, np.ndarray] = {}
    for i in range(48):
        rows, length = int(rng.integers(1, 4)), int(rng.choice([3, 5]))  # mixed shapes
        values = rng.standard_normal((rows, length)).astype(np.float32)
        sent[str(i)] = values
        triton.async_infer(
            "batched_identity", fp32_input(values), answers.callback(str(i)), request_id=str(i)
        )
    for tag, result, error in answers.wait(len(sent)):
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), sent[tag])
        assert result.get_response().id == tag
    after = stats(triton, "batched_identity")
    requests = after.inference_stats.success.count - before.inference_stats.success.count
    executions = after.execution_count - before.execution_count
    assert requests == len(sent)
    assert executions < requests, "no two requests shared an execution"
    assert any(b.batch_size > 3 for b in after.batch_stats), after.batch_stats


def test_padding_batches_different_lengths_and_slices_each_answer_back(
    triton: grpcclient.InferenceServerClient,
) -> None:
    before = stats(triton, "padded_identity")
    answers = Answers()
    rng = np.random.default_rng(2)
    sent: dict[str, np.ndarray] = {}
    for i in range(32):
        rows, length = int(rng.integers(1, 3)), int(rng.integers(1, 9))  # many lengths
        values = rng.standard_normal((rows, length)).astype(np.float32)
        sent[str(i)] = values
        triton.async_infer("padded_identity", fp32_input(values), answers.callback(str(i)))
    for tag, result, error in answers.wait(len(sent)):
        assert error is None, error
        output = result.as_numpy("OUTPUT0")
        assert output.shape == sent[tag].shape  # the padding (-7) is cut off again
        np.testing.assert_array_equal(output, sent[tag])
    after = stats(triton, "padded_identity")
    executions = after.execution_count - before.execution_count
    assert executions < len(sent) / 2, f"{executions} executions for {len(sent)} requests"


def test_batched_slow_model_runs_fewer_executions_than_requests(
    triton: grpcclient.InferenceServerClient,
) -> None:
    before = stats(triton, "slow_batched")
    answers = Answers()
    for i in range(12):
        triton.async_infer(
            "slow_batched", fp32_input(np.array([[float(i)]], np.float32)), answers.callback(str(i))
        )
    for tag, result, error in answers.wait(12):
        assert error is None, error
        assert result.as_numpy("OUTPUT0")[0, 0] == float(tag)
    after = stats(triton, "slow_batched")
    assert after.execution_count - before.execution_count < 12


def test_higher_priority_requests_overtake_queued_ones(
    triton: grpcclient.InferenceServerClient, batching_server: ServerProcess
) -> None:
    answers = Answers()
    occupy(triton, batching_server, "slow_priority", answers.callback)
    # Calls sent at once on separate HTTP/2 streams have no defined arrival order (the server's
    # gRPC threads take them in parallel): each is seen queued before the next is sent.
    for i in range(3):
        triton.async_infer("slow_priority", one_row(float(i)), answers.callback(f"low{i}"))
        batching_server.wait_for_pending("slow_priority", 2 + i)
    triton.async_infer("slow_priority", one_row(9.0), answers.callback("high"), priority=1)
    batching_server.wait_for_pending("slow_priority", 5)
    order = [tag for tag, _, error in answers.wait(6) if error is None]
    # The busy request computing first; the other waited at the default level, with the lows.
    assert {order[0], order[2]} == {"busy0", "busy1"}, order
    assert order[1] == "high", order
    assert order[3:] == ["low0", "low1", "low2"], order  # FIFO within a level


def test_a_full_queue_answers_resource_exhausted(
    triton: grpcclient.InferenceServerClient, batching_server: ServerProcess
) -> None:
    answers = Answers()
    occupy(triton, batching_server, "slow_bounded", answers.callback)  # one busy request queued
    triton.async_infer("slow_bounded", one_row(1.0), answers.callback("queued"))
    batching_server.wait_for_pending("slow_bounded", 2)
    with pytest.raises(InferenceServerException) as refused:
        triton.infer("slow_bounded", one_row(1.0))
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "max_queue_size 2" in refused.value.message()
    assert all(error is None for _, _, error in answers.wait(3))


def test_a_queue_timeout_rejects_without_computing(
    triton: grpcclient.InferenceServerClient, batching_server: ServerProcess
) -> None:
    """Two busy requests at once: whichever computes first, the other waits in the queue past its
    20 ms timeout (the first computes for over half a second) and is rejected, never computed."""
    answers = Answers()
    before = stats(triton, "slow_timeout")
    assert triton.is_server_live()  # connected: see occupy
    busy = fp32_input(np.full((1, BUSY_LENGTH), -1.0, np.float32))
    for tag in ("busy0", "busy1"):
        triton.async_infer("slow_timeout", busy, answers.callback(tag))
    errors = [error for _, _, error in answers.wait(2) if error is not None]
    assert len(errors) == 1, errors
    assert errors[0].status() == "StatusCode.UNAVAILABLE"
    assert "timeout" in errors[0].message()
    # A request after both: had the rejected one been computed, it would have been before this.
    triton.infer("slow_timeout", one_row(1.0))
    after = wait_for_inferences(triton, "slow_timeout", before, 2)
    assert after.inference_count - before.inference_count == 2
    assert after.execution_count - before.execution_count == 2  # a busy one and the last
    assert after.inference_stats.fail.count == before.inference_stats.fail.count + 1


def test_the_timeout_parameter_shortens_the_queue_timeout(
    triton: grpcclient.InferenceServerClient, batching_server: ServerProcess
) -> None:
    answers = Answers()
    occupy(triton, batching_server, "slow_override", answers.callback)
    with pytest.raises(InferenceServerException) as timed_out:
        triton.infer("slow_override", one_row(1.0), timeout=5000)
    assert timed_out.value.status() == "StatusCode.UNAVAILABLE"
    assert all(error is None for _, _, error in answers.wait(2))  # under the 60 s default


def test_a_deadline_that_passes_in_the_queue_is_never_computed(
    triton: grpcclient.InferenceServerClient, batching_server: ServerProcess
) -> None:
    answers = Answers()
    before = stats(triton, "slow_batched")
    fill_two_batches(triton, batching_server, answers)
    with pytest.raises(InferenceServerException) as late:
        triton.infer("slow_batched", one_row(1.0), client_timeout=0.04)
    assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    answers.wait(2)
    # grpc's own cancellation at the deadline leaves the late request to the core's deadline, so
    # only that takes it out of the queue. A request after the busy ones: had the late one stayed
    # queued, it would have been computed before this one, or with it.
    triton.infer("slow_batched", one_row(2.0))
    after = wait_for_inferences(triton, "slow_batched", before, 33)
    assert after.inference_count - before.inference_count == 33  # two batches of 16, the last
    assert after.execution_count - before.execution_count == 3
    assert after.inference_stats.fail.count == before.inference_stats.fail.count + 1


def test_a_cancelled_call_leaves_the_queue(
    triton: grpcclient.InferenceServerClient, batching_server: ServerProcess
) -> None:
    answers = Answers()
    before = stats(triton, "slow_batched")
    fill_two_batches(triton, batching_server, answers)
    call = triton.async_infer("slow_batched", one_row(1.0), answers.callback("cancelled"))
    batching_server.wait_for_pending("slow_batched", 2)
    call.cancel()
    results = answers.wait(3)
    assert {tag for tag, _, _ in results} == {"busy", "queued", "cancelled"}
    # A request after the busy ones: had the cancelled one stayed queued, it would have been
    # computed before this one, or with it.
    triton.infer("slow_batched", one_row(2.0))
    after = wait_for_inferences(triton, "slow_batched", before, 33)
    assert after.inference_count - before.inference_count == 33  # two batches of 16, the last
    assert after.execution_count - before.execution_count == 3
    assert after.inference_stats.fail.count == before.inference_stats.fail.count + 1


@pytest.mark.parametrize("priority", [3, 2**40])
def test_a_priority_beyond_the_levels_is_invalid(
    triton: grpcclient.InferenceServerClient, priority: int
) -> None:
    with pytest.raises(InferenceServerException) as bad:
        triton.infer("slow_priority", one_row(1.0), priority=priority)
    assert bad.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "outside 1..2" in bad.value.message()
