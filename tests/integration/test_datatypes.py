"""Every protocol datatype through an identity model: raw (tritonclient) and typed contents."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import grpc
import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, triton_to_np_dtype

from inferd.examples import DATATYPES

Serving = Callable[[grpcclient.InferenceServerClient], None]

# The InferTensorContents field of each datatype that has one (FP16 and BF16 have none).
CONTENTS_FIELDS: dict[str, str] = {
    name: d.contents_field for name, d in DATATYPES.items() if d.contents_field is not None
}

# Values each datatype's random data always includes (its edges).
SPECIAL_TEXT = [
    b"",
    "h\u00e9llo w\u00f6rld".encode(),
    "\u65e5\u672c\u8a9e".encode(),
    b"\xf0\x9f\x98\x80",
]


def _model(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


def _bf16_values(rng: np.random.Generator, count: int) -> npt.NDArray[np.float32]:
    """float32 values that bfloat16 holds exactly (low 16 bits zero), with its edge cases."""
    special = np.array(
        [0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, 3.3895314e38, 9.18355e-41], dtype=np.float32
    )
    values = (rng.standard_normal(count) * 100).astype(np.float32)
    values[: min(count, len(special))] = special[:count]
    bits = values.view(np.uint32) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def random_tensor(rng: np.random.Generator, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random data of ``datatype`` in tritonclient's numpy form, edge values first."""
    count = int(np.prod(shape))
    if datatype == "BOOL":
        flat: np.ndarray = rng.integers(0, 2, size=count).astype(np.bool_)
    elif datatype == "BYTES":
        words = [
            rng.bytes(int(rng.integers(0, 12))).hex().encode() + "\u00fc\u20ac".encode()
            for _ in range(count)
        ]
        flat = np.array(words, dtype=np.object_)
        flat[: min(count, len(SPECIAL_TEXT))] = SPECIAL_TEXT[:count]
    elif datatype == "BF16":
        flat = _bf16_values(rng, count)
    else:
        dtype = np.dtype(triton_to_np_dtype(datatype))
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            flat = rng.integers(info.min, info.max, size=count, dtype=dtype, endpoint=True)
            edges = np.array([info.min, info.max, 0, info.max - 1], dtype=dtype)
            if dtype.kind == "i":
                edges = np.array([info.min, -1, info.max, info.min + 1], dtype=dtype)
            flat[: min(count, len(edges))] = edges[:count]
        else:
            flat = (rng.standard_normal(count) * 1e3).astype(dtype)
            edges = np.array([np.inf, -np.inf, -0.0, np.finfo(dtype).max], dtype=dtype)
            flat[: min(count, len(edges))] = edges[:count]
    return flat.reshape(shape)


def _assert_same(datatype: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if datatype == "BYTES":
        assert got.tolist() == want.tolist()
    else:
        assert got.dtype == want.dtype
        # Bit-exact: -0.0, infinities and every payload survive the round trip.
        assert got.tobytes() == want.tobytes()


def _infer_identity(
    client: grpcclient.InferenceServerClient, datatype: str, data: np.ndarray
) -> np.ndarray:
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    result = client.infer(_model(datatype), [tensor])
    output = result.get_output("OUTPUT0")
    assert output.datatype == datatype
    assert list(output.shape) == list(data.shape)
    got: np.ndarray | None = result.as_numpy("OUTPUT0")
    assert got is not None
    return got


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_raw_round_trip(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator, datatype: str
) -> None:
    for shape in ((1, 1), (3, 7), (4, 33), (2, 0)):  # identity_fp32: max_batch_size 4
        data = random_tensor(rng, datatype, shape)
        _assert_same(datatype, _infer_identity(client, datatype, data), data)


def test_bf16_is_bit_exact(
    client: grpcclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    # Every finite bfloat16 sign/exponent combination, plus random mantissas.
    bits = rng.integers(0, 0x10000, size=(8, 512), dtype=np.uint32)
    finite = (bits & 0x7F80) != 0x7F80
    bits = np.where(finite, bits, bits & 0x807F)
    data = (bits << 16).astype(np.uint32).view(np.float32)
    got = _infer_identity(client, "BF16", data)
    assert got.dtype == np.float32
    assert got.tobytes() == data.tobytes()


def test_bytes_edge_cases(client: grpcclient.InferenceServerClient) -> None:
    words = [
        b"",
        b"",
        "na\u00efve caf\u00e9".encode(),
        "\u043f\u0440\u0438\u0432\u0435\u0442".encode(),
        "\U0001f680\U0001f30d".encode(),
        b"x" * 5000,
        b"nul\x00inside",
        b"\x00",
    ]
    data = np.array(words, dtype=np.object_).reshape(2, 4)
    _assert_same("BYTES", _infer_identity(client, "BYTES", data), data)
    only_empty = np.array([[b"", b""]], dtype=np.object_)
    _assert_same("BYTES", _infer_identity(client, "BYTES", only_empty), only_empty)


def test_bool(client: grpcclient.InferenceServerClient) -> None:
    data = np.array([[True, False, True, True], [False, False, True, False]])
    _assert_same("BOOL", _infer_identity(client, "BOOL", data), data)


def test_fp16(client: grpcclient.InferenceServerClient) -> None:
    data = np.array(
        [[0.0, -0.0, 1.0, -65504.0, 65504.0, 6.0e-8, np.inf, -np.inf, np.nan, 0.333]],
        dtype=np.float16,
    )
    _assert_same("FP16", _infer_identity(client, "FP16", data), data)


def test_uint64_large_values(client: grpcclient.InferenceServerClient) -> None:
    data = np.array([[2**64 - 1, 2**63, 2**63 - 1, 2**53 + 1, 0, 1]], dtype=np.uint64)
    _assert_same("UINT64", _infer_identity(client, "UINT64", data), data)


def test_int8_negative(client: grpcclient.InferenceServerClient) -> None:
    data = np.array([[-128, -127, -1, 0, 1, 127]], dtype=np.int8)
    _assert_same("INT8", _infer_identity(client, "INT8", data), data)


def test_large_message(client: grpcclient.InferenceServerClient, rng: np.random.Generator) -> None:
    # ~9.6 MB each way: past gRPC's 4 MiB default, within the server's limit.
    data = rng.standard_normal((4, 600_000)).astype(np.float32)
    _assert_same("FP32", _infer_identity(client, "FP32", data), data)


def _typed_request(
    datatype: str, data: np.ndarray, request_id: str = ""
) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=_model(datatype), id=request_id)
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=list(data.shape))
    values = data.reshape(-1).tolist()
    getattr(tensor.contents, CONTENTS_FIELDS[datatype]).extend(values)
    return request


def _decode_raw(datatype: str, raw: bytes, shape: list[int]) -> np.ndarray:
    if datatype == "BYTES":
        strings: np.ndarray = deserialize_bytes_tensor(raw)
        return strings.reshape(shape)
    return np.frombuffer(raw, dtype=triton_to_np_dtype(datatype)).reshape(shape)


@pytest.mark.parametrize("datatype", list(CONTENTS_FIELDS))
def test_typed_contents(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, rng: np.random.Generator, datatype: str
) -> None:
    for index, shape in enumerate(((1, 4), (4, 9))):
        data = random_tensor(rng, datatype, shape)
        request_id = f"{datatype}-{index}"
        response = stub.ModelInfer(_typed_request(datatype, data, request_id), timeout=30)
        assert response.id == request_id
        assert response.model_name == _model(datatype)
        assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
            ("OUTPUT0", datatype, list(shape))
        ]
        assert len(response.raw_output_contents) == 1
        got = _decode_raw(datatype, response.raw_output_contents[0], list(shape))
        _assert_same(datatype, got, data)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_typed_contents_for_16_bit_floats_is_invalid(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    client: grpcclient.InferenceServerClient,
    assert_serving: Serving,
    datatype: str,
) -> None:
    # Neither has an InferTensorContents field; the closest, fp32_contents, must not be accepted.
    request = service_pb2.ModelInferRequest(model_name=_model(datatype))
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=[1, 3])
    tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0])
    with pytest.raises(grpc.RpcError) as excinfo:
        stub.ModelInfer(request, timeout=30)
    error = cast(grpc.Call, excinfo.value)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "INPUT0" in error.details()
    assert datatype in error.details()
    assert_serving(client)
