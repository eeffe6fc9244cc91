"""Inference features through tritonclient: outputs, ids, parameters, async calls, streaming,
statistics and a model without batching."""

from __future__ import annotations

import queue
from collections.abc import Callable
from pathlib import Path
from typing import cast

import grpc
import numpy as np
import numpy.typing as npt
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import numpy_helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from inferd.examples import MLP_SIZES

Serving = Callable[[grpcclient.InferenceServerClient], None]
Int32Array = npt.NDArray[np.int32]
Float32Array = npt.NDArray[np.float32]
# (result, error) as tritonclient's callbacks receive them.
Answer = tuple[grpcclient.InferResult | None, InferenceServerException | None]

WAIT_S = 30.0


def simple_inputs(a: Int32Array, b: Int32Array) -> list[grpcclient.InferInput]:
    inputs = [
        grpcclient.InferInput("INPUT0", list(a.shape), "INT32"),
        grpcclient.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def random_pair(rng: np.random.Generator, batch: int) -> tuple[Int32Array, Int32Array]:
    a = rng.integers(-(2**20), 2**20, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-(2**20), 2**20, size=(batch, 16), dtype=np.int32)
    return a, b


def assert_simple(result: grpcclient.InferResult, a: Int32Array, b: Int32Array) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_infer_simple(client: grpcclient.InferenceServerClient, rng: np.random.Generator) -> None:
    for batch in (1, 2, 8):
        a, b = random_pair(rng, batch)
        result = client.infer("simple", simple_inputs(a, b))
        response = result.get_response()
        assert (response.model_name, response.model_version) == ("simple", "1")
        assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
            ("OUTPUT0", "INT32", [batch, 16]),
            ("OUTPUT1", "INT32", [batch, 16]),
        ]
        assert_simple(result, a, b)


def test_infer_explicit_version(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    a, b = random_pair(rng, 3)
    result = client.infer("simple", simple_inputs(a, b), model_version="1")
    assert result.get_response().model_version == "1"
    assert_simple(result, a, b)


def test_inputs_in_any_order(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    a, b = random_pair(rng, 3)
    result = client.infer("simple", list(reversed(simple_inputs(a, b))))
    assert_simple(result, a, b)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator, algorithm: str
) -> None:
    a, b = random_pair(rng, 5)
    result = client.infer("simple", simple_inputs(a, b), compression_algorithm=algorithm)
    assert_simple(result, a, b)


def test_output_selection(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    a, b = random_pair(rng, 2)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple", simple_inputs(a, b), outputs=outputs)
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    assert len(result.get_response().raw_output_contents) == 1
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_outputs_come_in_requested_order(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    a, b = random_pair(rng, 4)
    outputs = [
        grpcclient.InferRequestedOutput("OUTPUT1"),
        grpcclient.InferRequestedOutput("OUTPUT0"),
    ]
    result = client.infer("simple", simple_inputs(a, b), outputs=outputs)
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1", "OUTPUT0"]
    assert_simple(result, a, b)


def test_request_id_is_echoed(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    for request_id in ("req-1", "\u00e9t\u00e9-42", ""):
        a, b = random_pair(rng, 1)
        result = client.infer("simple", simple_inputs(a, b), request_id=request_id)
        assert result.get_response().id == request_id
        assert_simple(result, a, b)


def test_request_parameters_are_accepted(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    a, b = random_pair(rng, 2)
    parameters = {"custom_string": "value", "custom_int": 7, "custom_bool": True}
    result = client.infer("simple", simple_inputs(a, b), parameters=parameters)
    assert_simple(result, a, b)


def test_async_infer_many_concurrent(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    count = 64
    sent = [random_pair(rng, int(rng.integers(1, 9))) for _ in range(count)]
    answers: queue.Queue[tuple[int, grpcclient.InferResult | None, object]] = queue.Queue()

    def callback(index: int, result: grpcclient.InferResult | None, error: object) -> None:
        answers.put((index, result, error))

    for index, (a, b) in enumerate(sent):
        client.async_infer(
            "simple",
            simple_inputs(a, b),
            lambda result, error, index=index: callback(index, result, error),
            request_id=str(index),
        )
    seen: set[int] = set()
    for _ in range(count):
        index, result, error = answers.get(timeout=WAIT_S)
        assert error is None, error
        assert result is not None
        assert result.get_response().id == str(index)
        assert_simple(result, *sent[index])
        seen.add(index)
    assert seen == set(range(count))


def _mlp_reference(repository: Path, x: Float32Array) -> Float32Array:
    model = onnx.load(str(repository / "mlp" / "1" / "model.onnx"))
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    layers = len(MLP_SIZES) - 1
    y = x.astype(np.float64)
    for i in range(layers):
        y = y @ weights[f"fc{i}.weight"] + weights[f"fc{i}.bias"]
        if i < layers - 1:
            y = np.maximum(y, 0.0)
    return y.astype(np.float32)


def test_async_infer_mlp_rows_stay_apart(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator, repository: Path
) -> None:
    # Concurrent requests of several sizes, which the core may batch together: each answer must
    # be its own rows' result.
    count = 24
    sent = [
        rng.standard_normal((int(rng.integers(1, 6)), MLP_SIZES[0])).astype(np.float32)
        for _ in range(count)
    ]
    answers: queue.Queue[tuple[int, grpcclient.InferResult | None, object]] = queue.Queue()
    for index, x in enumerate(sent):
        tensor = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        client.async_infer(
            "mlp",
            [tensor],
            lambda result, error, index=index: answers.put((index, result, error)),
        )
    for _ in range(count):
        index, result, error = answers.get(timeout=WAIT_S)
        assert error is None, error
        assert result is not None
        got = result.as_numpy("OUTPUT0")
        assert got is not None
        assert got.shape == (sent[index].shape[0], MLP_SIZES[-1])
        np.testing.assert_allclose(
            got, _mlp_reference(repository, sent[index]), rtol=1e-4, atol=1e-4
        )


def test_stream_many_requests(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    answers: queue.Queue[Answer] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        sent = {f"stream-{i}": random_pair(rng, int(rng.integers(1, 9))) for i in range(20)}
        for request_id, (a, b) in sent.items():
            client.async_stream_infer("simple", simple_inputs(a, b), request_id=request_id)
        received: set[str] = set()
        for _ in sent:
            result, error = answers.get(timeout=WAIT_S)
            assert error is None, error
            assert result is not None
            request_id = result.get_response().id
            assert request_id in sent and request_id not in received
            received.add(request_id)
            assert_simple(result, *sent[request_id])
    finally:
        client.stop_stream()
    assert answers.empty()


def test_stream_error_then_keeps_working(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    answers: queue.Queue[Answer] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        a, b = random_pair(rng, 1)
        wrong = simple_inputs(a[:, :8], b[:, :8])  # 8 columns where the model takes 16
        client.async_stream_infer("simple", wrong, request_id="bad")
        result, error = answers.get(timeout=WAIT_S)
        assert result is None
        assert isinstance(error, InferenceServerException)
        assert "INPUT0" in error.message() and "16" in error.message()

        client.async_stream_infer("no_such_model", simple_inputs(a, b), request_id="unknown")
        result, error = answers.get(timeout=WAIT_S)
        assert result is None
        assert isinstance(error, InferenceServerException)
        assert "no_such_model" in error.message()

        sent = {f"after-{i}": random_pair(rng, 2) for i in range(5)}
        for request_id, (x, y) in sent.items():
            client.async_stream_infer("simple", simple_inputs(x, y), request_id=request_id)
        for _ in sent:
            result, error = answers.get(timeout=WAIT_S)
            assert error is None, error
            assert result is not None
            assert_simple(result, *sent[result.get_response().id])
    finally:
        client.stop_stream()


def test_stream_error_names_the_failed_request(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, rng: np.random.Generator
) -> None:
    # Stream answers come in completion order, so an error must say which request failed: as
    # Triton does, its infer_response carries the request's id.
    a, b = random_pair(rng, 1)

    def request(request_id: str, model: str) -> service_pb2.ModelInferRequest:
        message = service_pb2.ModelInferRequest(model_name=model, id=request_id)
        for name in ("INPUT0", "INPUT1"):
            message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.extend([a.tobytes(), b.tobytes()])
        return message

    requests = [
        request("good-1", "simple"),
        request("bad-1", "missing"),
        request("good-2", "simple"),
    ]
    responses = list(stub.ModelStreamInfer(iter(requests), timeout=WAIT_S))
    by_id = {r.infer_response.id: r for r in responses}
    assert sorted(by_id) == ["bad-1", "good-1", "good-2"]
    assert "missing" in by_id["bad-1"].error_message
    for request_id in ("good-1", "good-2"):
        response = by_id[request_id]
        assert response.error_message == ""
        raw = response.infer_response.raw_output_contents
        np.testing.assert_array_equal(np.frombuffer(raw[0], np.int32).reshape(1, 16), a + b)


def _statistics(
    client: grpcclient.InferenceServerClient, model: str
) -> service_pb2.ModelStatistics:
    response = client.get_inference_statistics(model)
    assert [(s.name, s.version) for s in response.model_stats] == [(model, "1")]
    stats: service_pb2.ModelStatistics = response.model_stats[0]
    return stats


def test_statistics_count_requests(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    model, count = "identity_int16", 12
    before = _statistics(client, model)
    for _ in range(count):  # one at a time: one execution each
        data = rng.integers(-1000, 1000, size=(1, 10), dtype=np.int16)
        tensor = grpcclient.InferInput("INPUT0", [1, 10], "INT16")
        tensor.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer(model, [tensor]).as_numpy("OUTPUT0"), data)
    after = _statistics(client, model)

    assert after.inference_count - before.inference_count == count
    assert after.execution_count - before.execution_count == count
    assert after.last_inference >= max(before.last_inference, 1)
    stats, old = after.inference_stats, before.inference_stats
    assert stats.success.count - old.success.count == count
    assert stats.fail.count == old.fail.count
    for name in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert getattr(stats, name).count - getattr(old, name).count == count, name
    for name in ("success", "compute_infer"):
        assert getattr(stats, name).ns > getattr(old, name).ns, name
    assert stats.success.ns >= stats.compute_infer.ns
    batches = {b.batch_size: b for b in after.batch_stats}
    assert 1 in batches
    assert batches[1].compute_infer.count >= count
    assert batches[1].compute_infer.ns > 0


def test_statistics_count_rows_of_batched_requests(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    model, rows = "identity_int16", 3
    before = _statistics(client, model)
    data = rng.integers(-1000, 1000, size=(rows, 4), dtype=np.int16)
    tensor = grpcclient.InferInput("INPUT0", [rows, 4], "INT16")
    tensor.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer(model, [tensor]).as_numpy("OUTPUT0"), data)
    after = _statistics(client, model)
    assert after.execution_count - before.execution_count == 1
    assert after.inference_stats.success.count - before.inference_stats.success.count == 1
    # Triton: "if a client sends a single inference request with batch size 64,
    # inference_count will be incremented by 64"; batch_stats are per batch size.
    assert after.inference_count - before.inference_count == rows
    assert rows in {b.batch_size for b in after.batch_stats}


def test_statistics_of_all_models(
    client: grpcclient.InferenceServerClient, server_models: list[str]
) -> None:
    response = client.get_inference_statistics()
    assert sorted(s.name for s in response.model_stats) == server_models
    by_version = client.get_inference_statistics("simple", "1")
    assert [s.name for s in by_version.model_stats] == ["simple"]


def test_model_without_batching(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    # max_batch_size 0: the request's shape is the model's full shape, no batch dim in front.
    for shape in ((3, 5), (1, 1), (12, 2)):
        data = rng.standard_normal(shape).astype(np.float32)
        tensor = grpcclient.InferInput("INPUT0", list(shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer("identity_nobatch", [tensor])
        assert list(result.get_output("OUTPUT0").shape) == list(shape)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("shape", [[4], [2, 3, 4]])
def test_model_without_batching_checks_rank(
    client: grpcclient.InferenceServerClient,
    rng: np.random.Generator,
    assert_serving: Serving,
    shape: list[int],
) -> None:
    data = rng.standard_normal(shape).astype(np.float32)
    tensor = grpcclient.InferInput("INPUT0", shape, "FP32")
    tensor.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as excinfo:
        client.infer("identity_nobatch", [tensor])
    assert excinfo.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "INPUT0" in excinfo.value.message()
    assert_serving(client)


def _mlp_input(rng: np.random.Generator, batch: int) -> list[grpcclient.InferInput]:
    x = rng.standard_normal((batch, MLP_SIZES[0])).astype(np.float32)
    tensor = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


def test_client_deadline_then_keeps_serving(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator, assert_serving: Serving
) -> None:
    with pytest.raises(InferenceServerException) as excinfo:
        client.infer("mlp", _mlp_input(rng, 64), client_timeout=0.0005)
    assert excinfo.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert_serving(client)


def test_stream_cancelled_with_requests_in_flight(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator, assert_serving: Serving
) -> None:
    answers: queue.Queue[Answer] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for i in range(16):
        client.async_stream_infer("mlp", _mlp_input(rng, 64), request_id=str(i))
    client.stop_stream(cancel_requests=True)
    assert_serving(client)

    # A new stream on the same client works.
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        while not answers.empty():
            answers.get_nowait()
        a, b = random_pair(rng, 3)
        client.async_stream_infer("simple", simple_inputs(a, b), request_id="fresh")
        while True:
            result, error = answers.get(timeout=WAIT_S)
            if result is not None and result.get_response().id == "fresh":
                break
            assert result is not None or error is not None
        assert_simple(result, a, b)
    finally:
        client.stop_stream()


def test_stream_ends_on_error_when_asked(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, rng: np.random.Generator
) -> None:
    # Triton's opt-in header: the first failed request ends the stream with its status.
    a, b = random_pair(rng, 1)
    good = service_pb2.ModelInferRequest(model_name="simple", id="good")
    for name in ("INPUT0", "INPUT1"):
        good.inputs.add(name=name, datatype="INT32", shape=[1, 16])
    good.raw_input_contents.extend([a.tobytes(), b.tobytes()])
    bad = service_pb2.ModelInferRequest(model_name="no_such_model", id="bad")
    call = stub.ModelStreamInfer(
        iter([good, bad]), timeout=WAIT_S, metadata=[("triton_grpc_error", "true")]
    )
    received: list[service_pb2.ModelStreamInferResponse] = []
    with pytest.raises(grpc.RpcError) as excinfo:
        for response in call:
            received.append(response)
    error = cast(grpc.Call, excinfo.value)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "no_such_model" in error.details()
    assert all(r.error_message == "" for r in received)
