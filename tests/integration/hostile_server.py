"""What the hostile-request table and the fuzzer share: a small model repository, a server on it,
the raw (bytes in, bytes out) calls they make, and the good request that must keep its answer.

The repository holds ``simple`` (INT32 sum and difference, the good request's model), an identity
model per protocol datatype (``identity_<datatype>``, batched, [-1, -1] with the batch) and
``identity_nobatch`` (FP32, no batching, any rank-2 shape: overflowing shapes reach the element
count there, not the batch-size check) and ``identity_timeout_override`` (FP32, requests may set
their queue timeout).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2

from inferd.examples import DATATYPES, format_config, write_identity_model
from inferd.examples import TensorSpec as ConfigTensor
from tests.integration.conftest import ServerProcess, running_server

SERVICE = "/inference.GRPCInferenceService/"
INFER = SERVICE + "ModelInfer"
STREAM_INFER = SERVICE + "ModelStreamInfer"
GOOD_MODEL = "simple"
NO_BATCH_MODEL = "identity_nobatch"
# FP32 identity whose queue lets a request's `timeout` parameter apply (Triton's
# allow_timeout_override): the parameter reaches the batcher's clock arithmetic.
TIMEOUT_MODEL = "identity_timeout_override"
TIMEOUT_POLICY = "dynamic_batching { default_queue_policy { allow_timeout_override: true } }\n"
# Every call has a deadline: a server that stalls fails the test instead of hanging it.
CALL_TIMEOUT_S = 30.0


def identity_model(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


def _write_simple(model_dir: Path) -> None:
    shape: list[int | str] = ["batch", 16]
    info = [
        helper.make_tensor_value_info(name, TensorProto.INT32, shape)
        for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        GOOD_MODEL,
        info[:2],
        info[2:],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.onnx").write_bytes(model.SerializeToString())
    tensors = [ConfigTensor(name, "TYPE_INT32", [16]) for name in ("INPUT0", "INPUT1")]
    outputs = [ConfigTensor(name, "TYPE_INT32", [16]) for name in ("OUTPUT0", "OUTPUT1")]
    (model_dir / "config.pbtxt").write_text(
        format_config(GOOD_MODEL, 8, tensors, outputs), encoding="utf-8"
    )


def write_repository(root: Path) -> list[str]:
    _write_simple(root / GOOD_MODEL)
    names = [GOOD_MODEL, NO_BATCH_MODEL]
    for datatype in DATATYPES:
        write_identity_model(root / identity_model(datatype), datatype)
        names.append(identity_model(datatype))
    write_identity_model(root / NO_BATCH_MODEL, "FP32", max_batch_size=0)
    write_identity_model(root / TIMEOUT_MODEL, "FP32")
    with (root / TIMEOUT_MODEL / "config.pbtxt").open("a", encoding="utf-8") as config:
        config.write(TIMEOUT_POLICY)
    names.append(TIMEOUT_MODEL)
    return sorted(names)


@contextlib.contextmanager
def hostile_server(workdir: Path) -> Iterator[ServerProcess]:
    """A server of its own on the repository above: what a hostile request does to it cannot
    spill into the other integration tests."""
    repository = workdir / "models"
    models = write_repository(repository)
    with running_server(repository, models, workdir) as server:
        yield server


def raw_unary(channel: grpc.Channel, method: str, payload: bytes) -> bytes:
    """``payload`` sent as the request of ``method`` exactly as given (no serializer)."""
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    answer: bytes = call(payload, timeout=CALL_TIMEOUT_S)
    return answer


def good_request(
    rng: np.random.Generator,
) -> tuple[service_pb2.ModelInferRequest, np.ndarray, np.ndarray]:
    """A correct request to ``simple`` and its two operands."""
    a = rng.integers(-1000, 1000, size=(2, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(2, 16), dtype=np.int32)
    request = service_pb2.ModelInferRequest(model_name=GOOD_MODEL, id="good")
    for name, data in (("INPUT0", a), ("INPUT1", b)):
        request.inputs.add(name=name, datatype="INT32", shape=[2, 16])
        request.raw_input_contents.append(data.tobytes())
    return request, a, b


def check_good_answer(answer: bytes, a: np.ndarray, b: np.ndarray) -> None:
    response = service_pb2.ModelInferResponse.FromString(answer)
    outputs = {
        output.name: np.frombuffer(raw, dtype="<i4").reshape(tuple(output.shape))
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    }
    assert sorted(outputs) == ["OUTPUT0", "OUTPUT1"], response
    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)


def assert_still_serving(channel: grpc.Channel, rng: np.random.Generator) -> None:
    """A good request still gets the right answer."""
    request, a, b = good_request(rng)
    check_good_answer(raw_unary(channel, INFER, request.SerializeToString()), a, b)


# Protobuf's wire format by hand, for what a message class cannot serialize.
VARINT, FIXED64, LENGTH_DELIMITED, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5


def varint(value: int) -> bytes:
    """``value`` as a base-128 varint; negative values as their 64-bit two's complement."""
    value &= (1 << 64) - 1 if value < 0 else (1 << 80) - 1
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def length_delimited(field: int, payload: bytes) -> bytes:
    return tag(field, LENGTH_DELIMITED) + varint(len(payload)) + payload
