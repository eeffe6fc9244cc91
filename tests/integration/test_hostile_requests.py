"""Hostile requests over a raw channel (issue 13): bytes that are not protobuf, wire-format tricks,
well-formed ModelInferRequests that lie about their shapes, counts and types, names of 20 KB,
odd versions and parameters of the wrong type. Each gets its status code (and, where it matters,
a fragment of its message), and each is followed by a good request that must still get the right
answer: no bad request may crash, stall or change the server for anyone else.

The expected codes are the issue's and Triton's (../shared/reference/protocol-and-field.md §1.3,
§1.4, §7): a request that is wrong answers INVALID_ARGUMENT, an unknown model or version NOT_FOUND,
an unsupported feature UNIMPLEMENTED; a hostile request that is valid gets its right answer.
Payloads go unserialized (``request_serializer=None``): the server sees exactly these bytes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from inferd.examples import DATATYPES
from tests.integration.conftest import ServerProcess
from tests.integration.hostile_server import (
    CALL_TIMEOUT_S,
    END_GROUP,
    FIXED32,
    GOOD_MODEL,
    INFER,
    LENGTH_DELIMITED,
    NO_BATCH_MODEL,
    SERVICE,
    START_GROUP,
    STREAM_INFER,
    TIMEOUT_MODEL,
    VARINT,
    assert_still_serving,
    check_good_answer,
    good_request,
    hostile_server,
    identity_model,
    length_delimited,
    raw_unary,
    tag,
    varint,
)
from tests.unit.test_wire import ONE_VALUE  # a value of each typed-contents field's type

Request = service_pb2.ModelInferRequest
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED
OK = grpc.StatusCode.OK
HUGE_NAME = "n" * 20_000  # past grpc's default 8 KB metadata limit if a message echoes it whole
INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1


@dataclass(frozen=True)
class Hostile:
    """One hostile request: its bytes, the RPC it goes to, and what the answer must be."""

    payload: Callable[[], bytes]
    code: grpc.StatusCode
    says: tuple[str, ...] = ()
    method: str = INFER
    # For requests that must be answered (code OK): checks the answer.
    answer: Callable[[bytes], None] | None = None


# --- Builders --------------------------------------------------------------------------------


def _good_bytes() -> bytes:
    request, _, _ = good_request(np.random.default_rng(0))
    return request.SerializeToString()


def _good_checked(
    edit: Callable[[Request], None],
) -> tuple[Callable[[], bytes], Callable[[bytes], None]]:
    """A good request changed by ``edit`` that must still get the good request's answer."""
    request, a, b = good_request(np.random.default_rng(1))
    edit(request)
    payload = request.SerializeToString()
    return (lambda: payload), (lambda answer: check_good_answer(answer, a, b))


def _simple(edit: Callable[[Request], None]) -> Callable[[], bytes]:
    def build() -> bytes:
        request, _, _ = good_request(np.random.default_rng(2))
        edit(request)
        return request.SerializeToString()

    return build


def _raw(model: str, datatype: str, shape: list[int], data: bytes) -> Callable[[], bytes]:
    def build() -> bytes:
        request = Request(model_name=model)
        request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
        request.raw_input_contents.append(data)
        return request.SerializeToString()

    return build


def _typed(
    model: str, datatype: str, shape: list[int], field: str, values: list[object]
) -> Callable[[], bytes]:
    def build() -> bytes:
        request = Request(model_name=model)
        entry = request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
        getattr(entry.contents, field).extend(values)
        return request.SerializeToString()

    return build


def _with_parameter(key: str, kind: str, value: object) -> Callable[[Request], None]:
    def edit(request: Request) -> None:
        setattr(request.parameters[key], kind, value)

    return edit


def _version(version: str) -> Callable[[], bytes]:
    return _simple(lambda r: setattr(r, "model_version", version))


def _bytes_elements(*elements: bytes) -> bytes:
    return b"".join(len(e).to_bytes(4, "little") + e for e in elements)


def _add_input(name: str, datatype: str = "INT32") -> Callable[[Request], None]:
    def edit(request: Request) -> None:
        request.inputs.add(name=name, datatype=datatype, shape=[2, 16])
        request.raw_input_contents.append(bytes(128))

    return edit


def _drop_input(request: Request) -> None:
    del request.inputs[1]
    del request.raw_input_contents[1]


def _set_shape(index: int, shape: list[int]) -> Callable[[Request], None]:
    def edit(request: Request) -> None:
        del request.inputs[index].shape[:]
        request.inputs[index].shape.extend(shape)

    return edit


def _requested(*names: str) -> Callable[[Request], None]:
    def edit(request: Request) -> None:
        for name in names:
            request.outputs.add(name=name)

    return edit


def _output_parameter(key: str) -> Callable[[Request], None]:
    def edit(request: Request) -> None:
        request.outputs.add(name="OUTPUT0").parameters[key].string_param = "x"

    return edit


def _many_inputs(request: Request) -> None:
    for i in range(5000):
        request.inputs.add(name=f"EXTRA{i}", datatype="INT32", shape=[1])


def _many_parameters(request: Request) -> None:
    for i in range(5000):
        request.parameters[f"p{i}"].bool_param = True


def _many_outputs(request: Request) -> None:
    for _ in range(5000):
        request.outputs.add(name="OUTPUT0")


def _many_raw_contents(request: Request) -> None:
    request.raw_input_contents.extend([b""] * 5000)


def _input_parameters(request: Request) -> None:
    for i in range(5000):
        request.inputs[0].parameters[f"p{i}"].int64_param = i


def _special_floats() -> tuple[Callable[[], bytes], Callable[[bytes], None]]:
    """NaN, infinities and a negative zero are data like any other: returned bit for bit."""
    data = np.array([[np.nan, np.inf, -np.inf, -0.0]], dtype="<f4").tobytes()
    payload = _raw(identity_model("FP32"), "FP32", [1, 4], data)()

    def answer(raw: bytes) -> None:
        assert service_pb2.ModelInferResponse.FromString(raw).raw_output_contents[0] == data

    return (lambda: payload), answer


def _named(rpc: str, version: str) -> Callable[[], bytes]:
    """The ``{name, version}`` request of ``rpc`` (ModelMetadata, ModelConfig, ...) for simple."""
    message = getattr(service_pb2, f"{rpc}Request")(name=GOOD_MODEL, version=version)
    payload: bytes = message.SerializeToString()
    return lambda: payload


def _not_ready(answer: bytes) -> None:
    assert not service_pb2.ModelReadyResponse.FromString(answer).ready


def _wire(*parts: bytes) -> Callable[[], bytes]:
    payload = b"".join(parts)
    return lambda: payload


def _unknown_field_first() -> tuple[Callable[[], bytes], Callable[[bytes], None]]:
    """A good request behind fields this protocol does not define: protobuf skips them."""
    request, a, b = good_request(np.random.default_rng(3))
    unknown = tag(99, VARINT) + varint(7) + length_delimited(1000, b"ignored") + tag(2047, FIXED32)
    payload = unknown + bytes(4) + request.SerializeToString()
    return (lambda: payload), (lambda answer: check_good_answer(answer, a, b))


def _id_echoed(request_id: str) -> tuple[Callable[[], bytes], Callable[[bytes], None]]:
    build, check = _good_checked(lambda r: setattr(r, "id", request_id))

    def answer(raw: bytes) -> None:
        check(raw)
        assert service_pb2.ModelInferResponse.FromString(raw).id == request_id

    return build, answer


# The typed-contents field of each datatype that has one, with a value of its type.
TYPED_FIELDS: dict[str, tuple[str, object]] = {
    name: (d.contents_field, ONE_VALUE[d.contents_field])
    for name, d in DATATYPES.items()
    if d.contents_field is not None
}


def _typed_count_cases() -> dict[str, Hostile]:
    cases: dict[str, Hostile] = {}
    for datatype, (field, value) in TYPED_FIELDS.items():
        model = identity_model(datatype)
        for count in (3, 5):
            cases[f"{field} of {datatype}: {count} values for shape [1, 4]"] = Hostile(
                _typed(model, datatype, [1, 4], field, [value] * count),
                INVALID,
                ("INPUT0",),
            )
    return cases


def _identity_timeout(
    timeout_us: int, model: str = TIMEOUT_MODEL
) -> tuple[Callable[[], bytes], Callable[[bytes], None]]:
    """A request to an FP32 identity model with a timeout: answered, and unchanged."""
    data = np.arange(8, dtype="<f4").tobytes()
    request = Request(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 4])
    request.raw_input_contents.append(data)
    request.parameters["timeout"].int64_param = timeout_us
    payload = request.SerializeToString()

    def answer(raw: bytes) -> None:
        response = service_pb2.ModelInferResponse.FromString(raw)
        assert list(response.outputs[0].shape) == [2, 4], response.outputs
        assert response.raw_output_contents[0] == data

    return (lambda: payload), answer


def _good_answers(
    make: Callable[[], tuple[Callable[[], bytes], Callable[[bytes], None]]],
) -> Hostile:
    build, check = make()
    return Hostile(build, OK, answer=check)


CASES: dict[str, Hostile] = {
    # Not protobuf, or protobuf broken at the wire level.
    "garbage bytes": Hostile(lambda: b"\xff" * 64, INVALID),
    "text, not protobuf": Hostile(lambda: b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", INVALID),
    "good request truncated in the middle": Hostile(
        lambda: _good_bytes()[: len(_good_bytes()) // 2], INVALID
    ),
    "good request missing its last byte": Hostile(lambda: _good_bytes()[:-1], INVALID),
    "string length past the end": Hostile(
        _wire(tag(1, LENGTH_DELIMITED), varint(1000), b"abc"), INVALID
    ),
    "string length of 2^63": Hostile(
        _wire(tag(1, LENGTH_DELIMITED), varint(1 << 63), b"abc"), INVALID
    ),
    "model_name as a varint (wrong wire type)": Hostile(_wire(tag(1, VARINT), varint(5)), INVALID),
    "inputs as a fixed32 (wrong wire type)": Hostile(_wire(tag(5, FIXED32), bytes(4)), INVALID),
    "raw_input_contents as a varint (wrong wire type)": Hostile(
        _wire(length_delimited(1, GOOD_MODEL.encode()), tag(7, VARINT), varint(1)), INVALID
    ),
    "packed shape ending inside a varint": Hostile(
        _wire(
            length_delimited(1, GOOD_MODEL.encode()),
            length_delimited(5, length_delimited(1, b"INPUT0") + length_delimited(3, b"\xff")),
        ),
        INVALID,
    ),
    "varint of 11 bytes": Hostile(_wire(tag(3, VARINT), b"\xff" * 10 + b"\x01"), INVALID),
    "varint never terminated": Hostile(_wire(tag(3, VARINT), b"\xff" * 5), INVALID),
    "field number 0": Hostile(_wire(tag(0, VARINT), varint(1)), INVALID),
    "field number past 2^29 - 1": Hostile(_wire(tag(1 << 29, VARINT), varint(1)), INVALID),
    "wire type 6": Hostile(_wire(varint(1 << 3 | 6), varint(1)), INVALID),
    "wire type 7": Hostile(_wire(varint(1 << 3 | 7), varint(1)), INVALID),
    "group never ended": Hostile(_wire(tag(9, START_GROUP), tag(1, VARINT), varint(1)), INVALID),
    "end of a group never started": Hostile(_wire(tag(9, END_GROUP)), INVALID),
    "input message that is garbage": Hostile(
        _wire(length_delimited(1, GOOD_MODEL.encode()), length_delimited(5, b"\xff" * 8)), INVALID
    ),
    "model name that is not UTF-8": Hostile(_wire(length_delimited(1, b"simple\xff\xfe")), INVALID),
    "unknown fields before a good request": _good_answers(_unknown_field_first),
    # Not protobuf, to RPCs other than ModelInfer (the Python server's included).
    **{
        f"garbage bytes to {rpc}": Hostile(lambda: b"\xff" * 16, INVALID, method=SERVICE + rpc)
        for rpc in (
            "ServerMetadata",
            "ModelReady",
            "ModelMetadata",
            "ModelConfig",
            "ModelStatistics",
            "RepositoryIndex",
        )
    },
    # Shapes.
    "negative dimension": Hostile(_simple(_set_shape(0, [-2, 16])), INVALID, ("negative",)),
    "negative non-batch dimension": Hostile(
        _raw(identity_model("FP32"), "FP32", [1, -4], bytes(16)), INVALID, ("negative",)
    ),
    "most negative int64 dimension": Hostile(
        _raw(identity_model("FP32"), "FP32", [1, -(1 << 63)], bytes(16)), INVALID
    ),
    "dimension of 2^62": Hostile(
        _raw(identity_model("FP32"), "FP32", [1, 1 << 62], bytes(16)), INVALID
    ),
    "dimensions whose product overflows int64": Hostile(
        _raw(NO_BATCH_MODEL, "FP32", [1 << 32, 1 << 32], bytes(16)), INVALID
    ),
    "dimensions whose product wraps to a small number": Hostile(
        _raw(NO_BATCH_MODEL, "FP32", [1 << 62, 4], bytes(0)), INVALID
    ),
    "dimensions of int64 max": Hostile(
        _raw(NO_BATCH_MODEL, "FP32", [INT64_MAX, INT64_MAX], bytes(4)), INVALID
    ),
    "rank 100 for a rank-2 model": Hostile(
        _raw(identity_model("FP32"), "FP32", [1] * 100, bytes(4)), INVALID
    ),
    "70,000 dimensions": Hostile(
        _raw(identity_model("FP32"), "FP32", [1] * 70_000, bytes(4)), INVALID
    ),
    "empty shape for a batched model": Hostile(
        _raw(identity_model("FP32"), "FP32", [], bytes(4)), INVALID
    ),
    "batch of 9 for max_batch_size 8": Hostile(
        _simple(lambda r: [_set_shape(i, [9, 16])(r) for i in (0, 1)]), INVALID
    ),
    "inputs that disagree on the batch size": Hostile(_simple(_set_shape(1, [1, 16])), INVALID),
    "fp32_contents of 1,000 values claiming 2^40 elements": Hostile(
        _typed(identity_model("FP32"), "FP32", [1, 1 << 40], "fp32_contents", [1.0] * 1000), INVALID
    ),
    # Typed contents that do not match the shape, for every typed field.
    **_typed_count_cases(),
    "typed contents for FP16 (it has no typed field)": Hostile(
        _typed(identity_model("FP16"), "FP16", [1, 2], "fp32_contents", [1.0, 2.0]), INVALID
    ),
    "typed contents for BF16 (it has no typed field)": Hostile(
        _typed(identity_model("BF16"), "BF16", [1, 2], "uint_contents", [1, 2]), INVALID
    ),
    "FP32 input given fp64_contents": Hostile(
        _typed(identity_model("FP32"), "FP32", [1, 2], "fp64_contents", [1.0, 2.0]), INVALID
    ),
    "UINT8 value 256": Hostile(
        _typed(identity_model("UINT8"), "UINT8", [1, 2], "uint_contents", [1, 256]), INVALID
    ),
    "INT16 value 40,000": Hostile(
        _typed(identity_model("INT16"), "INT16", [1, 2], "int_contents", [1, 40_000]), INVALID
    ),
    "input with neither contents nor raw data": Hostile(
        lambda: Request(
            model_name=identity_model("FP32"),
            inputs=[Request.InferInputTensor(name="INPUT0", datatype="FP32", shape=[1, 4])],
        ).SerializeToString(),
        INVALID,
    ),
    # raw_input_contents.
    "three raw_input_contents for two inputs": Hostile(
        _simple(lambda r: r.raw_input_contents.append(bytes(128))), INVALID, ("raw_input_contents",)
    ),
    "one raw_input_contents for two inputs": Hostile(
        _simple(lambda r: r.raw_input_contents.__delitem__(1)), INVALID, ("raw_input_contents",)
    ),
    "raw_input_contents and typed contents both": Hostile(
        _simple(lambda r: r.inputs[0].contents.int_contents.extend(range(32))),
        INVALID,
        ("contents",),
    ),
    "raw data one byte short": Hostile(
        _raw(identity_model("FP64"), "FP64", [1, 2], bytes(15)), INVALID
    ),
    "raw data one byte long": Hostile(
        _raw(identity_model("FP64"), "FP64", [1, 2], bytes(17)), INVALID
    ),
    "BYTES length prefix past the end": Hostile(
        _raw(
            identity_model("BYTES"),
            "BYTES",
            [1, 2],
            _bytes_elements(b"ok") + (99).to_bytes(4, "little"),
        ),
        INVALID,
        ("INPUT0",),
    ),
    "BYTES length prefix of 2^32 - 1": Hostile(
        _raw(identity_model("BYTES"), "BYTES", [1, 1], b"\xff\xff\xff\xff" + b"abc"), INVALID
    ),
    "BYTES length prefix cut short": Hostile(
        _raw(identity_model("BYTES"), "BYTES", [1, 2], _bytes_elements(b"a") + b"\x01\x00"), INVALID
    ),
    "BYTES: fewer elements than the shape": Hostile(
        _raw(identity_model("BYTES"), "BYTES", [1, 3], _bytes_elements(b"a", b"")), INVALID
    ),
    "BYTES: a million empty elements for shape [1, 1]": Hostile(
        _raw(identity_model("BYTES"), "BYTES", [1, 1], bytes(4_000_000)), INVALID
    ),
    "BYTES that are not UTF-8": Hostile(
        _raw(identity_model("BYTES"), "BYTES", [1, 2], _bytes_elements(b"ok", b"\xff\xfe")),
        INVALID,
        ("UTF-8",),
    ),
    "BYTES in bytes_contents that are not UTF-8": Hostile(
        _typed(identity_model("BYTES"), "BYTES", [1, 2], "bytes_contents", [b"ok", b"\xc3\x28"]),
        INVALID,
        ("UTF-8",),
    ),
    "batch of zero rows": Hostile(_raw(identity_model("FP32"), "FP32", [0, 4], b""), INVALID),
    "NaN and infinities in FP32 data": _good_answers(_special_floats),
    # Datatypes.
    "unknown datatype FP8": Hostile(
        _raw(identity_model("FP32"), "FP8", [1, 4], bytes(4)), INVALID, ("FP8",)
    ),
    "empty datatype": Hostile(_raw(identity_model("FP32"), "", [1, 4], bytes(16)), INVALID),
    "lower-case datatype": Hostile(
        _raw(identity_model("FP32"), "fp32", [1, 4], bytes(16)), INVALID
    ),
    "config enum name as datatype": Hostile(
        _raw(identity_model("FP32"), "TYPE_FP32", [1, 4], bytes(16)), INVALID
    ),
    "datatype the model does not take": Hostile(
        _simple(lambda r: setattr(r.inputs[0], "datatype", "FP32")), INVALID, ("INT32",)
    ),
    # Inputs.
    "input missing": Hostile(_simple(_drop_input), INVALID, ("INPUT1",)),
    "input given twice": Hostile(_simple(_add_input("INPUT1")), INVALID, ("INPUT1",)),
    "unknown input": Hostile(_simple(_add_input("INPUT7")), INVALID, ("INPUT7",)),
    "input with an empty name": Hostile(_simple(_add_input("")), INVALID),
    "no inputs at all": Hostile(
        lambda: Request(model_name=GOOD_MODEL).SerializeToString(), INVALID
    ),
    "5,000 inputs": Hostile(_simple(_many_inputs), INVALID),
    "5,000 raw_input_contents": Hostile(_simple(_many_raw_contents), INVALID),
    "5,000 parameters on one input": Hostile(_simple(_input_parameters), INVALID),
    # Requested outputs.
    "5,000 requested outputs": Hostile(_simple(_many_outputs), INVALID),
    "unknown requested output": Hostile(_simple(_requested("OUTPUT9")), INVALID, ("OUTPUT9",)),
    "requested output with an empty name": Hostile(_simple(_requested("")), INVALID),
    "classification requested": Hostile(
        _simple(_output_parameter("classification")), UNIMPLEMENTED
    ),
    "output to shared memory without its byte size": Hostile(
        _simple(_output_parameter("shared_memory_region")), INVALID, ("shared_memory_byte_size",)
    ),
    # Parameters of the wrong type or range.
    "priority as a string": Hostile(
        _simple(_with_parameter("priority", "string_param", "high")), INVALID, ("priority",)
    ),
    "priority as a bool": Hostile(
        _simple(_with_parameter("priority", "bool_param", True)), INVALID, ("priority",)
    ),
    "priority as a double": Hostile(
        _simple(_with_parameter("priority", "double_param", 1.5)), INVALID, ("priority",)
    ),
    "negative priority": Hostile(
        _simple(_with_parameter("priority", "int64_param", -1)), INVALID, ("priority",)
    ),
    "priority 2^64 - 1 on a model without levels": _good_answers(
        lambda: _good_checked(_with_parameter("priority", "uint64_param", UINT64_MAX))
    ),
    "timeout as a string": Hostile(
        _simple(_with_parameter("timeout", "string_param", "10s")), INVALID, ("timeout",)
    ),
    "timeout as a double": Hostile(
        _simple(_with_parameter("timeout", "double_param", 1e6)), INVALID, ("timeout",)
    ),
    "negative timeout": Hostile(
        _simple(_with_parameter("timeout", "int64_param", -5)), INVALID, ("timeout",)
    ),
    "timeout of 2^62 microseconds": _good_answers(
        lambda: _good_checked(_with_parameter("timeout", "int64_param", 1 << 62))
    ),
    "timeout of int64 max microseconds": _good_answers(
        lambda: _good_checked(_with_parameter("timeout", "int64_param", INT64_MAX))
    ),
    "timeout of 2^53 microseconds on a model that honours it": _good_answers(
        lambda: _identity_timeout(1 << 53)
    ),
    "timeout of int64 max microseconds on a model that honours it": _good_answers(
        lambda: _identity_timeout(INT64_MAX)
    ),
    "timeout of int64 max microseconds on a model without dynamic batching": _good_answers(
        lambda: _identity_timeout(INT64_MAX, NO_BATCH_MODEL)
    ),
    "binary_data_output as a string (meaningless over gRPC)": _good_answers(
        lambda: _good_checked(_with_parameter("binary_data_output", "string_param", "yes"))
    ),
    "5,000 request parameters": Hostile(_simple(_many_parameters), INVALID),
    # Names of 20 KB: the status must reach the client as what it is.
    "model name of 20 KB": Hostile(
        _simple(lambda r: setattr(r, "model_name", HUGE_NAME)), NOT_FOUND
    ),
    "version of 20 KB": Hostile(_version("1" * 20_000), NOT_FOUND),
    "input name of 20 KB": Hostile(
        _simple(lambda r: setattr(r.inputs[1], "name", HUGE_NAME)), INVALID
    ),
    "requested output name of 20 KB": Hostile(_simple(_requested(HUGE_NAME)), INVALID),
    "datatype of 20 KB": Hostile(
        _simple(lambda r: setattr(r.inputs[0], "datatype", HUGE_NAME)), INVALID
    ),
    "model name of 20 KB to ModelMetadata": Hostile(
        lambda: service_pb2.ModelMetadataRequest(name=HUGE_NAME).SerializeToString(),
        NOT_FOUND,
        method=SERVICE + "ModelMetadata",
    ),
    "model name of 20 KB to ModelConfig": Hostile(
        lambda: service_pb2.ModelConfigRequest(name=HUGE_NAME).SerializeToString(),
        NOT_FOUND,
        method=SERVICE + "ModelConfig",
    ),
    "model name of 20 KB to ModelStatistics": Hostile(
        lambda: service_pb2.ModelStatisticsRequest(name=HUGE_NAME).SerializeToString(),
        NOT_FOUND,
        method=SERVICE + "ModelStatistics",
    ),
    "request id of 20 KB, echoed": _good_answers(lambda: _id_echoed("i" * 20_000)),
    # Names that look like paths or hide a NUL name no model.
    **{
        f"model name {name!r}": Hostile(
            _simple(lambda r, n=name: setattr(r, "model_name", n)), NOT_FOUND
        )
        for name in ("../simple", "simple/../simple", "./simple", "/simple", "simple\x00", "SIMPLE")
    },
    # Versions: only the exact decimal of a version names it.
    **{
        f"version {version!r}": Hostile(_version(version), NOT_FOUND)
        for version in (
            " 1",
            "1 ",
            "0_1",
            "-1",
            "+1",
            "1.0",
            "0x1",
            "0",
            "01",
            "1\x00",
            "99999999999999999999",
        )
    },
    # The same versions to the RPCs that name a model version.
    **{
        f"version {version[:8]!r} to {rpc}": Hostile(
            _named(rpc, version), NOT_FOUND, method=SERVICE + rpc
        )
        for rpc in ("ModelMetadata", "ModelConfig", "ModelStatistics")
        for version in (" 1", "0_1", "1" * 20_000)
    },
    **{
        f"version {version[:8]!r} to ModelReady": Hostile(
            _named("ModelReady", version), OK, method=SERVICE + "ModelReady", answer=_not_ready
        )
        for version in (" 1", "0_1", "1" * 20_000)
    },
}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with hostile_server(tmp_path_factory.mktemp("hostile")) as server:
        yield server


@pytest.fixture(scope="module")
def raw_channel(hostile: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(hostile.url) as channel:
        yield channel


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _answer(channel: grpc.Channel, case: Hostile) -> tuple[grpc.StatusCode, str, bytes]:
    try:
        answer = raw_unary(channel, case.method, case.payload())
    except grpc.RpcError as error:
        call = cast(grpc.Call, error)
        return call.code(), call.details() or "", b""
    return OK, "", answer


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 60, len(CASES)
    assert {d for d in TYPED_FIELDS} == set(DATATYPES) - {"FP16", "BF16"}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_request(
    raw_channel: grpc.Channel, hostile: ServerProcess, rng: np.random.Generator, name: str
) -> None:
    case = CASES[name]
    code, details, answer = _answer(raw_channel, case)
    assert code == case.code, f"{name}: {code.name} {details[:500]!r}"
    for fragment in case.says:
        assert fragment in details, (fragment, details[:500])
    # What a client reads never carries the server's files or Python's internals.
    assert str(hostile.repository) not in details, details[:500]
    assert "Traceback" not in details and "Error:" not in details, details[:500]
    if case.answer is not None:
        case.answer(answer)
    assert_still_serving(raw_channel, rng)


def test_requested_output_named_twice_is_refused_or_returned_once(
    raw_channel: grpc.Channel, rng: np.random.Generator
) -> None:
    """Triton keeps requested outputs in a set; returning one twice confuses every client."""
    request, a, b = good_request(rng)
    request.outputs.add(name="OUTPUT0")
    request.outputs.add(name="OUTPUT0")
    try:
        answer = raw_unary(raw_channel, INFER, request.SerializeToString())
    except grpc.RpcError as error:
        call = cast(grpc.Call, error)
        assert call.code() == INVALID, call.details()
        assert "OUTPUT0" in (call.details() or "")
    else:
        response = service_pb2.ModelInferResponse.FromString(answer)
        assert [o.name for o in response.outputs] == ["OUTPUT0"], response.outputs
        got = np.frombuffer(response.raw_output_contents[0], dtype="<i4").reshape(2, 16)
        np.testing.assert_array_equal(got, a + b)
    assert_still_serving(raw_channel, rng)


# --- ModelStreamInfer ------------------------------------------------------------------------


def _stream(
    channel: grpc.Channel, messages: list[bytes]
) -> tuple[list[bytes], grpc.StatusCode, str]:
    """Sends ``messages`` on one stream and reads until the server ends it: the responses, the
    final code and its details."""
    call = channel.stream_stream(STREAM_INFER, request_serializer=None, response_deserializer=None)
    responses: list[bytes] = []
    replies = call(iter(messages), timeout=CALL_TIMEOUT_S)
    try:
        for reply in replies:
            responses.append(reply)
    except grpc.RpcError as error:
        rpc = cast(grpc.Call, error)
        return responses, rpc.code(), rpc.details() or ""
    return responses, OK, ""


def _stream_answer(raw: bytes) -> service_pb2.ModelStreamInferResponse:
    return service_pb2.ModelStreamInferResponse.FromString(raw)


def test_stream_malformed_message_after_valid_ones(
    raw_channel: grpc.Channel, rng: np.random.Generator
) -> None:
    """The accepted requests are answered, then the stream ends with INVALID_ARGUMENT."""
    goods = [good_request(rng) for _ in range(6)]
    messages = [r.SerializeToString() for r, _, _ in goods] + [b"\xff" * 32]
    responses, code, details = _stream(raw_channel, messages)
    assert code == INVALID, (code, details)
    assert len(responses) == len(goods), [_stream_answer(r).error_message for r in responses]
    for raw, (_, a, b) in zip(responses, goods, strict=True):
        reply = _stream_answer(raw)
        assert reply.error_message == "", reply.error_message
        check_good_answer(reply.infer_response.SerializeToString(), a, b)
    assert_still_serving(raw_channel, rng)


def test_stream_malformed_first_message(
    raw_channel: grpc.Channel, rng: np.random.Generator
) -> None:
    responses, code, details = _stream(raw_channel, [_wire(tag(5, FIXED32), bytes(4))()])
    assert (code, responses) == (INVALID, []), details
    assert_still_serving(raw_channel, rng)


def test_stream_bad_request_between_good_ones(
    raw_channel: grpc.Channel, rng: np.random.Generator
) -> None:
    """A request that is wrong but well formed is answered in the stream (error_message, as
    Triton does) and the stream goes on."""
    first, second = good_request(rng), good_request(rng)
    first[0].id, second[0].id = "first", "second"
    bad = Request(model_name="no_such_model")
    messages = [
        first[0].SerializeToString(),
        bad.SerializeToString(),
        second[0].SerializeToString(),
    ]
    responses, code, details = _stream(raw_channel, messages)
    assert code == OK, details
    replies = [_stream_answer(r) for r in responses]
    assert len(replies) == 3, replies
    failed = [r for r in replies if r.error_message]
    assert len(failed) == 1 and "no_such_model" in failed[0].error_message, replies
    answered = sorted(
        (r for r in replies if not r.error_message), key=lambda r: r.infer_response.id
    )
    for reply, (_, a, b) in zip(answered, (first, second), strict=True):
        check_good_answer(reply.infer_response.SerializeToString(), a, b)
    assert_still_serving(raw_channel, rng)
