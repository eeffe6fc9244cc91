"""Triton python-backend models written from Triton's documented API (the models are in
triton_python_models.py) served by a real inferd and called through tritonclient.grpc: BLS
(``InferenceRequest.exec`` and ``async_exec`` into an ONNX model of the same repository) and a
decoupled "repeat" model streaming one response per input element on ModelStreamInfer."""

from __future__ import annotations

import concurrent.futures
import json
import queue
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import ServerProcess, running_server
from tests.integration.triton_python_models import (
    WIDTH,
    write_bls_repository,
    write_decoupled_repository,
)
from tests.unit.test_metrics import get

MISSING = "no_such_model"
STREAM_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def bls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("triton-bls")
    names = write_bls_repository(root / "models")
    with running_server(
        root / "models",
        names,
        root,
        # The calls to the missing model answer INTERNAL on purpose (each leaves an error record).
        expected_errors=lambda record: MISSING in str(record),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def decoupled_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("triton-decoupled")
    names = write_decoupled_repository(root / "models")
    with running_server(
        root / "models",
        names,
        root,
        # square_int32's error response for IN < 0 answers INTERNAL on purpose.
        expected_errors=lambda record: "IN must be at least 0" in str(record.get("reason")),
    ) as running:
        yield running


def scale_in_process(repository: Path, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(
        str(repository / "scale" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    (y,) = session.run(None, {"INPUT0": x})
    return np.asarray(y)


def bls_inputs(x: np.ndarray, target: str) -> list[grpcclient.InferInput]:
    rows = x.shape[0]
    tensors = [
        grpcclient.InferInput("INPUT0", list(x.shape), "FP32"),
        grpcclient.InferInput("MODEL_NAME", [rows, 1], "BYTES"),
    ]
    tensors[0].set_data_from_numpy(x)
    tensors[1].set_data_from_numpy(np.array([[target.encode()]] * rows, dtype=np.object_))
    return tensors


def call_bls(url: str, model: str, x: np.ndarray, target: str = "scale") -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as client:
        return np.asarray(client.infer(model, bls_inputs(x, target)).as_numpy("OUTPUT0"))


def inputs_of(rng: np.random.Generator, count: int) -> list[np.ndarray]:
    """``count`` FP32 inputs of 1 to 3 rows each."""
    return [
        rng.standard_normal((int(rng.integers(1, 4)), WIDTH)).astype(np.float32)
        for _ in range(count)
    ]


def test_bls_answers_twice_the_onnx_models_answer(
    bls_server: ServerProcess, rng: np.random.Generator
) -> None:
    xs = inputs_of(rng, 24)
    # Sent at once: bls_sync's execute gets several requests, and its BLS calls queue in scale's
    # batcher together.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda x: call_bls(bls_server.url, "bls_sync", x), xs))
    for x, answer in zip(xs, answers, strict=True):
        assert answer.dtype == np.float32 and answer.shape == x.shape
        np.testing.assert_array_equal(answer, 2 * scale_in_process(bls_server.repository, x))


def test_async_bls_gathers_three_calls_per_request(
    bls_server: ServerProcess, rng: np.random.Generator
) -> None:
    xs = inputs_of(rng, 16)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda x: call_bls(bls_server.url, "bls_async", x), xs))
    for x, answer in zip(xs, answers, strict=True):
        parts = [scale_in_process(bls_server.repository, x + np.float32(k)) for k in (0, 1, 2)]
        np.testing.assert_array_equal(answer, parts[0] + parts[1] + parts[2])


def test_a_bls_call_to_a_missing_model_is_the_calling_models_error_response(
    bls_server: ServerProcess,
) -> None:
    x = np.ones((1, WIDTH), dtype=np.float32)
    with pytest.raises(InferenceServerException) as raised:
        call_bls(bls_server.url, "bls_sync", x, target=MISSING)
    assert str(raised.value.status()) == "StatusCode.INTERNAL", raised.value
    prefix = f"BLS call to '{MISSING}' failed: "
    message = raised.value.message()
    assert message.startswith(prefix), message  # exec() answered an error response, not raised
    assert MISSING in message.removeprefix(prefix), message  # the call's error names the model
    # The model serves on.
    expected = 2 * scale_in_process(bls_server.repository, x)
    np.testing.assert_array_equal(call_bls(bls_server.url, "bls_sync", x), expected)


def test_an_async_bls_call_to_a_missing_model_fails_the_request_naming_it(
    bls_server: ServerProcess,
) -> None:
    x = np.ones((2, WIDTH), dtype=np.float32)
    with pytest.raises(InferenceServerException, match=MISSING) as raised:
        call_bls(bls_server.url, "bls_async", x, target=MISSING)
    assert str(raised.value.status()) == "StatusCode.INTERNAL", raised.value
    assert call_bls(bls_server.url, "bls_async", x).shape == x.shape


def call_text(url: str, texts: list[bytes]) -> tuple[list[bytes], str]:
    """``bls_text``'s answer to ``texts``: its TEXT_OUT, and the parameters text_upper saw."""
    with grpcclient.InferenceServerClient(url) as client:
        text = grpcclient.InferInput("TEXT", [len(texts)], "BYTES")
        text.set_data_from_numpy(np.array(texts, dtype=object))
        result = client.infer("bls_text", [text])
        parameters = result.as_numpy("PARAMETERS")
        return list(result.as_numpy("TEXT_OUT")), parameters[0].decode() if len(parameters) else ""


def test_a_bls_call_carries_bytes_and_parameters_to_a_python_model(
    bls_server: ServerProcess,
) -> None:
    texts = [b"abc", b"", "h\u00e9llo".encode(), b"x" * 5000]
    answer, parameters = call_text(bls_server.url, texts)
    assert answer == [t.upper() for t in texts]
    # The called model sees the caller's parameters, typed, and not the call chain inferd adds.
    assert json.loads(parameters) == {"k": 5, "flag": True, "s": "x"}


def test_a_bls_call_that_outlives_its_execute_is_answered_and_the_model_serves_on(
    bls_server: ServerProcess,
) -> None:
    # Each leave-open request starts a call from a thread execute does not wait for (Triton
    # allows it): made while the batch runs, on the ring, and answered after the batch was (over
    # the control channel), or made after it; either way it gets its answer, which the next such
    # request reports.
    seen = [call_text(bls_server.url, [b"leave-open"])[0][0] for _ in range(6)]
    assert seen == [b"none"] + [b"LEAVE-OPEN"] * 5
    answer, _ = call_text(bls_server.url, [b"after"])
    assert answer == [b"AFTER"]


def is_final(result: grpcclient.InferResult) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def stream(
    url: str, model: str, values: np.ndarray, delays_ms: np.ndarray | None = None
) -> list[grpcclient.InferResult]:
    """Every response of one ModelStreamInfer request to ``model``, the final one included
    (``enable_empty_final_response``: the final flag comes as a response of its own)."""
    if delays_ms is None:
        delays_ms = np.zeros(values.shape, dtype=np.uint32)
    tensors = [
        grpcclient.InferInput("IN", list(values.shape), "INT32"),
        grpcclient.InferInput("DELAY", list(delays_ms.shape), "UINT32"),
    ]
    tensors[0].set_data_from_numpy(values)
    tensors[1].set_data_from_numpy(delays_ms)
    answers: queue.Queue[tuple[grpcclient.InferResult | None, Exception | None]] = queue.Queue()
    results: list[grpcclient.InferResult] = []
    with grpcclient.InferenceServerClient(url) as client:
        # tritonclient holds one stream per client.
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer(
            model, tensors, request_id=f"{model}-{len(values)}", enable_empty_final_response=True
        )
        while not results or not is_final(results[-1]):
            result, error = answers.get(timeout=STREAM_TIMEOUT_S)
            if error is not None:
                raise error
            assert result is not None
            results.append(result)
        client.stop_stream()  # waits for the stream to end: nothing may follow the final flag
    assert answers.empty(), answers.get()
    return results


def check_repeated(results: list[grpcclient.InferResult], values: np.ndarray) -> None:
    """One response per element, in order, then the final flag alone."""
    assert len(results) == len(values) + 1, [r.get_response() for r in results]
    for index, (result, value) in enumerate(zip(results, values, strict=False)):
        assert not is_final(result), index
        np.testing.assert_array_equal(result.as_numpy("OUT"), np.array([value], dtype=np.int32))
        np.testing.assert_array_equal(result.as_numpy("IDX"), np.array([index], dtype=np.uint32))
    final = results[-1].get_response()
    assert is_final(results[-1]) and not final.outputs, final


@pytest.mark.parametrize("model", ["repeat_int32", "repeat_threaded"])
def test_sixteen_concurrent_streams_each_get_their_responses_in_order_then_the_final_flag(
    decoupled_server: ServerProcess, rng: np.random.Generator, model: str
) -> None:
    requests = [
        rng.integers(-(2**31), 2**31 - 1, size=int(n), dtype=np.int32)
        for n in rng.integers(5, 21, size=16)
    ]

    def one_stream(values: np.ndarray) -> list[grpcclient.InferResult]:
        delays = rng.integers(0, 3, size=values.shape, dtype=np.uint32)  # interleaves the streams
        return stream(decoupled_server.url, model, values, delays)

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        streamed = list(pool.map(one_stream, requests))
    for values, results in zip(requests, streamed, strict=True):
        check_repeated(results, values)
        request_ids = {r.get_response().id for r in results}
        assert request_ids == {f"{model}-{len(values)}"}, request_ids  # each names its request


@pytest.mark.parametrize("model", ["repeat_int32", "repeat_threaded"])
def test_an_empty_input_streams_only_the_final_flag(
    decoupled_server: ServerProcess, model: str
) -> None:
    results = stream(decoupled_server.url, model, np.zeros(0, dtype=np.int32))
    check_repeated(results, np.zeros(0, dtype=np.int32))
    assert len(results) == 1


def test_model_infer_on_a_decoupled_model_is_unimplemented_naming_it(
    decoupled_server: ServerProcess,
) -> None:
    values = np.arange(3, dtype=np.int32)
    tensors = [
        grpcclient.InferInput("IN", [3], "INT32"),
        grpcclient.InferInput("DELAY", [3], "UINT32"),
    ]
    tensors[0].set_data_from_numpy(values)
    tensors[1].set_data_from_numpy(np.zeros(3, dtype=np.uint32))
    with (
        grpcclient.InferenceServerClient(decoupled_server.url) as client,
        pytest.raises(InferenceServerException) as raised,
    ):
        client.infer("repeat_int32", tensors)
    assert str(raised.value.status()) == "StatusCode.UNIMPLEMENTED", raised.value
    assert "repeat_int32" in raised.value.message(), raised.value


def square_input(n: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([n], dtype=np.int32))
    return [tensor]


def test_a_response_sent_with_the_final_flag_is_the_last_response_and_carries_the_flag(
    decoupled_server: ServerProcess,
) -> None:
    answers: queue.Queue[tuple[grpcclient.InferResult | None, Exception | None]] = queue.Queue()
    with grpcclient.InferenceServerClient(decoupled_server.url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for n in (3, 0):
            client.async_stream_infer(
                "square_int32",
                square_input(n),
                request_id=f"n{n}",
                enable_empty_final_response=True,
            )
        results = []
        while len(results) < 3 + 1:
            result, error = answers.get(timeout=STREAM_TIMEOUT_S)
            assert error is None, error
            results.append(result)
        client.stop_stream()
    assert answers.empty(), answers.get()
    by_request = {rid: [r for r in results if r.get_response().id == rid] for rid in ("n3", "n0")}
    # n = 3: three responses, no empty one after: the third carries the final flag itself.
    assert [is_final(r) for r in by_request["n3"]] == [False, False, True]
    assert [r.as_numpy("OUT").tolist() for r in by_request["n3"]] == [[3]] * 3
    # n = 0: the final flag alone.
    (final,) = by_request["n0"]
    assert is_final(final) and not final.get_response().outputs


def test_an_error_response_fails_its_request_on_the_stream_and_the_stream_serves_on(
    decoupled_server: ServerProcess,
) -> None:
    answers: queue.Queue[tuple[grpcclient.InferResult | None, Exception | None]] = queue.Queue()
    with grpcclient.InferenceServerClient(decoupled_server.url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("square_int32", square_input(-4), request_id="bad")
        result, error = answers.get(timeout=STREAM_TIMEOUT_S)
        assert result is None and error is not None
        assert "IN must be at least 0, got -4" in str(error), error
        client.async_stream_infer("square_int32", square_input(2), request_id="good")
        outs = [answers.get(timeout=STREAM_TIMEOUT_S) for _ in range(2)]
        client.stop_stream()
    assert answers.empty(), answers.get()
    assert [(r.get_response().id, r.as_numpy("OUT").tolist()) for r, _ in outs] == [
        ("good", [2]),
        ("good", [2]),
    ]


def model_series(server: ServerProcess, name: str, model: str) -> float:
    """The sum of the ``name`` samples labelled with ``model`` at /metrics now."""
    text = get(server.metrics_url)[1]
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.labels.get("model") == model
    )


def test_the_metrics_count_the_streamed_responses_and_time_the_first(
    decoupled_server: ServerProcess,
) -> None:
    responses = "inferd_responses_total"
    first_count = "inferd_first_response_duration_us_count"
    first_sum = "inferd_first_response_duration_us_sum"
    before = {
        n: model_series(decoupled_server, n, "repeat_int32") for n in (responses, first_count)
    }
    before_sum = model_series(decoupled_server, first_sum, "repeat_int32")
    # The first response waits 50 ms: the time to it is at least that.
    stream(
        decoupled_server.url,
        "repeat_int32",
        np.arange(7, dtype=np.int32),
        np.array([50, 0, 0, 0, 0, 0, 0], dtype=np.uint32),
    )
    stream(decoupled_server.url, "repeat_int32", np.arange(4, dtype=np.int32))
    after = {n: model_series(decoupled_server, n, "repeat_int32") for n in (responses, first_count)}
    assert after[responses] - before[responses] == 7 + 4, (before, after)
    assert after[first_count] - before[first_count] == 2, (before, after)
    assert model_series(decoupled_server, first_sum, "repeat_int32") - before_sum >= 50_000
