"""Bad requests get a clear status and a message naming what is wrong, and the server keeps
serving: every case is followed by a good request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

Serving = Callable[[grpcclient.InferenceServerClient], None]


def tensor(name: str, data: np.ndarray, datatype: str = "") -> grpcclient.InferInput:
    shaped = grpcclient.InferInput(name, list(data.shape), datatype or _triton_type(data))
    shaped.set_data_from_numpy(data)
    return shaped


def _triton_type(data: np.ndarray) -> str:
    name: str = np_to_triton_dtype(data.dtype)
    return name


@dataclass
class Case:
    """A request tritonclient can send, and what its error must say."""

    model: str
    inputs: Callable[[np.random.Generator], list[grpcclient.InferInput]]
    code: str
    says: list[str]
    version: str = ""
    outputs: list[str] = field(default_factory=list)


def _int32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.integers(-100, 100, size=shape, dtype=np.int32)


def _pair(
    rng: np.random.Generator, shape0: tuple[int, ...], shape1: tuple[int, ...]
) -> list[grpcclient.InferInput]:
    return [tensor("INPUT0", _int32(rng, *shape0)), tensor("INPUT1", _int32(rng, *shape1))]


GOOD = ((2, 16), (2, 16))

CLIENT_CASES: dict[str, Case] = {
    "unknown model": Case(
        "no_such_model", lambda rng: _pair(rng, *GOOD), "NOT_FOUND", ["no_such_model"]
    ),
    "unknown version": Case(
        "simple", lambda rng: _pair(rng, *GOOD), "NOT_FOUND", ["simple", "'3'"], version="3"
    ),
    "non-numeric version": Case(
        "simple", lambda rng: _pair(rng, *GOOD), "NOT_FOUND", ["simple", "'one'"], version="one"
    ),
    "wrong datatype": Case(
        "simple",
        lambda rng: [
            tensor("INPUT0", rng.standard_normal((2, 16)).astype(np.float32)),
            tensor("INPUT1", _int32(rng, 2, 16)),
        ],
        "INVALID_ARGUMENT",
        ["INPUT0", "INT32", "FP32"],
    ),
    "wrong rank": Case(
        "simple", lambda rng: _pair(rng, (16,), (16,)), "INVALID_ARGUMENT", ["INPUT0", "[16]"]
    ),
    "wrong fixed dim": Case(
        "simple",
        lambda rng: _pair(rng, (2, 16), (2, 15)),
        "INVALID_ARGUMENT",
        ["INPUT1", "[2, 15]", "[-1, 16]"],
    ),
    "batch above max_batch_size": Case(
        "simple",
        lambda rng: _pair(rng, (9, 16), (9, 16)),
        "INVALID_ARGUMENT",
        ["INPUT0", "9", "max_batch_size"],
    ),
    "inputs disagree on batch size": Case(
        "simple",
        lambda rng: _pair(rng, (2, 16), (3, 16)),
        "INVALID_ARGUMENT",
        ["INPUT1", "INPUT0", "batch size"],
    ),
    "missing input": Case(
        "simple",
        lambda rng: [tensor("INPUT0", _int32(rng, 2, 16))],
        "INVALID_ARGUMENT",
        ["INPUT1", "missing"],
    ),
    "unexpected input": Case(
        "simple",
        lambda rng: [*_pair(rng, *GOOD), tensor("INPUT2", _int32(rng, 2, 16))],
        "INVALID_ARGUMENT",
        ["INPUT2"],
    ),
    "input given twice": Case(
        "simple",
        lambda rng: [*_pair(rng, *GOOD), tensor("INPUT1", _int32(rng, 2, 16))],
        "INVALID_ARGUMENT",
        ["INPUT1", "twice"],
    ),
    "unknown requested output": Case(
        "simple",
        lambda rng: _pair(rng, *GOOD),
        "INVALID_ARGUMENT",
        ["OUTPUT9", "OUTPUT0", "OUTPUT1"],
        outputs=["OUTPUT0", "OUTPUT9"],
    ),
    "BYTES that are not UTF-8": Case(
        "identity_bytes",
        lambda rng: [tensor("INPUT0", np.array([[b"ok", b"\xff\xfe"]], dtype=np.object_), "BYTES")],
        "INVALID_ARGUMENT",
        ["INPUT0", "UTF-8"],
    ),
    "batch of zero rows": Case(
        "simple", lambda rng: _pair(rng, (0, 16), (0, 16)), "INVALID_ARGUMENT", ["INPUT0", "0"]
    ),
}


@pytest.mark.parametrize("name", list(CLIENT_CASES))
def test_client_error(
    client: grpcclient.InferenceServerClient,
    rng: np.random.Generator,
    assert_serving: Serving,
    name: str,
) -> None:
    case = CLIENT_CASES[name]
    outputs = [grpcclient.InferRequestedOutput(o) for o in case.outputs] or None
    with pytest.raises(InferenceServerException) as excinfo:
        client.infer(case.model, case.inputs(rng), model_version=case.version, outputs=outputs)
    error = excinfo.value
    assert error.status() == f"StatusCode.{case.code}", error
    for text in case.says:
        assert text in error.message(), (text, error.message())
    assert_serving(client)


def _raw_request(
    model: str, **tensors: tuple[str, list[int], bytes]
) -> service_pb2.ModelInferRequest:
    """A request with raw_input_contents: name -> (datatype, shape, bytes)."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, (datatype, shape, data) in tensors.items():
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(data)
    return request


def _simple_raw(
    a: bytes, b: bytes, shape: list[int] | None = None
) -> service_pb2.ModelInferRequest:
    shape = shape or [1, 16]
    return _raw_request("simple", INPUT0=("INT32", shape, a), INPUT1=("INT32", shape, b))


def _both_raw_and_contents() -> service_pb2.ModelInferRequest:
    request = _simple_raw(bytes(64), bytes(64))
    request.inputs[1].contents.int_contents.extend(range(16))
    return request


def _raw_count_mismatch() -> service_pb2.ModelInferRequest:
    request = _simple_raw(bytes(64), bytes(64))
    del request.raw_input_contents[1]
    return request


def _typed(
    model: str, datatype: str, shape: list[int], field_name: str, values: list[int]
) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    entry = request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    getattr(entry.contents, field_name).extend(values)
    return request


def _shared_memory(byte_size: int | None = None) -> service_pb2.ModelInferRequest:
    request = _raw_request("simple", INPUT0=("INT32", [1, 16], bytes(64)))
    request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    request.inputs[1].parameters["shared_memory_region"].string_param = "region"
    if byte_size is not None:
        request.inputs[1].parameters["shared_memory_byte_size"].int64_param = byte_size
    return request


def _length(n: int) -> bytes:
    return n.to_bytes(4, "little")


RAW_CASES: dict[str, tuple[Callable[[], object], grpc.StatusCode, list[str]]] = {
    "raw bytes shorter than the shape": (
        lambda: _simple_raw(bytes(64), bytes(60)),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT1", "60", "64"],
    ),
    "raw bytes longer than the shape": (
        lambda: _simple_raw(bytes(68), bytes(64)),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT0", "68", "64"],
    ),
    "raw and contents both set": (
        _both_raw_and_contents,
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT1", "contents", "raw_input_contents"],
    ),
    "raw_input_contents count differs from inputs": (
        _raw_count_mismatch,
        grpc.StatusCode.INVALID_ARGUMENT,
        ["raw_input_contents", "1", "2"],
    ),
    "malformed BYTES: length beyond the end": (
        lambda: _raw_request(
            "identity_bytes", INPUT0=("BYTES", [1, 2], _length(2) + b"ok" + _length(99) + b"short")
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT0", "BYTES"],
    ),
    "malformed BYTES: truncated length prefix": (
        lambda: _raw_request(
            "identity_bytes", INPUT0=("BYTES", [1, 1], _length(1) + b"a" + b"\x01\x00")
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT0", "BYTES"],
    ),
    "BYTES element count differs from the shape": (
        lambda: _raw_request(
            "identity_bytes", INPUT0=("BYTES", [1, 3], _length(1) + b"a" + _length(0))
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT0", "2", "[1, 3]"],
    ),
    "unknown datatype": (
        lambda: _raw_request("identity_fp32", INPUT0=("FP8", [1, 4], bytes(4))),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT0", "FP8"],
    ),
    "negative dimension": (
        lambda: _simple_raw(bytes(64), bytes(64), shape=[-1, 16]),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT0", "negative"],
    ),
    "typed contents out of range": (
        lambda: _typed("identity_int8", "INT8", [1, 3], "int_contents", [1, 300, -2]),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT0", "INT8"],
    ),
    "typed contents of the wrong length": (
        lambda: _typed("identity_int32", "INT32", [2, 3], "int_contents", [1, 2, 3, 4, 5]),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT0", "[2, 3]"],
    ),
    "typed contents in another type's field": (
        lambda: _typed("identity_int64", "INT64", [1, 2], "int_contents", [1, 2]),
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT0"],
    ),
    "shared-memory input without its byte size": (
        _shared_memory,
        grpc.StatusCode.INVALID_ARGUMENT,
        ["INPUT1", "'shared_memory_byte_size' must be given"],
    ),
    # These tests' server listens on TCP, where shared memory is not served by default.
    "shared-memory input on TCP": (
        lambda: _shared_memory(64),
        grpc.StatusCode.PERMISSION_DENIED,
        ["INPUT1", "not accepted on this listener"],
    ),
}


@pytest.mark.parametrize("name", list(RAW_CASES))
def test_raw_request_error(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    client: grpcclient.InferenceServerClient,
    assert_serving: Serving,
    name: str,
) -> None:
    build, code, says = RAW_CASES[name]
    with pytest.raises(grpc.RpcError) as excinfo:
        stub.ModelInfer(build(), timeout=30)
    error = cast(grpc.Call, excinfo.value)
    assert error.code() == code, error.details()
    for text in says:
        assert text in error.details(), (text, error.details())
    assert_serving(client)


def test_errors_do_not_count_as_inferences(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator, assert_serving: Serving
) -> None:
    before = client.get_inference_statistics("simple").model_stats[0]
    with pytest.raises(InferenceServerException):
        client.infer("simple", _pair(rng, (2, 16), (2, 15)))
    after = client.get_inference_statistics("simple").model_stats[0]
    assert after.inference_count == before.inference_count
    assert after.execution_count == before.execution_count
    assert_serving(client)


def test_statistics_of_unknown_model(
    client: grpcclient.InferenceServerClient, assert_serving: Serving
) -> None:
    with pytest.raises(InferenceServerException) as excinfo:
        client.get_inference_statistics("no_such_model")
    assert excinfo.value.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in excinfo.value.message()
    assert_serving(client)


@pytest.mark.parametrize(
    ("sequence", "named"),
    [
        ({"sequence_id": 7, "sequence_start": True}, "sequence_id"),
        ({"sequence_id": "session-a"}, "sequence_id"),
    ],
)
def test_a_request_of_a_sequence_is_refused_until_sequences_exist(
    client: grpcclient.InferenceServerClient,
    rng: np.random.Generator,
    assert_serving: Serving,
    sequence: dict[str, object],
    named: str,
) -> None:
    """Issue 25, item 9: served one by one, a stateful client's requests would be answered
    without their sequence's state and without a word; the parameter is named instead."""
    with pytest.raises(InferenceServerException) as excinfo:
        client.infer("simple", _pair(rng, *GOOD), **sequence)  # type: ignore[arg-type]
    error = excinfo.value
    assert error.status() == "StatusCode.INVALID_ARGUMENT", error
    assert f"request parameter '{named}': the model has no sequence batching" in error.message()
    # Over a stream too, and the stream goes on.
    answers: list[tuple[object, object]] = []
    client.start_stream(callback=lambda result, error: answers.append((result, error)))
    try:
        client.async_stream_infer("simple", _pair(rng, *GOOD), sequence_end=True, sequence_id=9)
        client.async_stream_infer("simple", _pair(rng, *GOOD))
    finally:
        client.stop_stream()
    assert len(answers) == 2
    failed = [err for _, err in answers if err is not None]
    assert len(failed) == 1 and "the model has no sequence batching" in str(failed[0]), answers
    assert_serving(client)
