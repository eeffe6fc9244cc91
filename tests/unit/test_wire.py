"""The core's ModelInferRequest parser and ModelInferResponse writer against protobuf's own
serializer: randomised requests of every datatype, raw and typed, go in as protobuf's bytes; the
answers must be byte for byte what protobuf writes for the expected response."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import inferd._proto.grpc_service_pb2 as pb
from inferd.core import (
    BatcherOptions,
    CompletionDispatcher,
    HostBufferPool,
    ModelScheduler,
    core_signature,
    parse_infer_request,
)
from inferd.datatypes import DATATYPES, Datatype
from inferd.errors import InvalidArgument, PermissionDenied, Unimplemented
from inferd.models import TensorSpec

# The protocol's statement of which InferTensorContents field carries each datatype (FP16 and
# BF16 have none): an oracle, kept apart from inferd.datatypes' table on purpose, so that a wrong
# row there fails test_the_contents_table_is_the_protocol_s instead of being agreed with.
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


class Identity:
    """Answers its one input as its one output."""

    def execute(self, inputs: list[Any]) -> list[Any]:
        return list(inputs)

    def close(self) -> None:
        pass


def model_name(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


@pytest.fixture
async def schedulers() -> AsyncIterator[dict[str, ModelScheduler]]:
    dispatcher = CompletionDispatcher(asyncio.get_running_loop())
    pool = HostBufferPool(1 << 24)
    out: dict[str, ModelScheduler] = {}
    for name, datatype in DATATYPES.items():
        spec_in = TensorSpec("INPUT0", datatype, (-1,))
        spec_out = TensorSpec("OUTPUT0", datatype, (-1,))
        out[name] = ModelScheduler(
            dispatcher,
            pool,
            core_signature(model_name(name), "1", 8, [spec_in], [spec_out]),
            BatcherOptions(dynamic=True, max_batch_size=8),
            [Identity()],
            [datatype.config_type],
        )
    yield out
    for scheduler in out.values():
        await scheduler.close()
    dispatcher.close()


def random_values(rng: np.random.Generator, datatype: Datatype, count: int) -> list[Any]:
    name = datatype.name
    if name == "BOOL":
        return [bool(v) for v in rng.integers(0, 2, count)]
    if name == "BYTES":
        return [
            bytes(rng.integers(32, 127, rng.integers(0, 9)).astype(np.uint8)) for _ in range(count)
        ]
    if name in ("FP16", "FP32", "FP64"):
        return list(rng.standard_normal(count).astype(datatype.numpy))
    if name == "BF16":
        return [int(v) for v in rng.integers(0, 2**16, count)]
    info = np.iinfo(datatype.numpy)
    return [
        int(v)
        for v in rng.integers(
            info.min, info.max, count, endpoint=True, dtype=np.int64 if info.min < 0 else np.uint64
        )
    ]


def raw_bytes(datatype: Datatype, values: list[Any]) -> bytes:
    if datatype.is_bytes:
        return b"".join(len(v).to_bytes(4, "little") + v for v in values)
    return np.array(values, dtype=datatype.numpy).tobytes()


def request_for(
    rng: np.random.Generator, datatype: Datatype, typed: bool
) -> tuple[pb.ModelInferRequest, pb.ModelInferResponse]:
    rows, cols = int(rng.integers(1, 5)), int(rng.integers(0, 6))
    values = random_values(rng, datatype, rows * cols)
    request_id = "".join(rng.choice(list("abcé漢7"), int(rng.integers(0, 6))))
    request = pb.ModelInferRequest(model_name=model_name(datatype.name), id=request_id)
    tensor = request.inputs.add(name="INPUT0", datatype=datatype.name, shape=[rows, cols])
    if typed:
        field = getattr(tensor.contents, CONTENTS_FIELD[datatype.name])
        field.extend(values if datatype.name != "FP32" else [float(v) for v in values])
    else:
        request.raw_input_contents.append(raw_bytes(datatype, values))
    # Parameters the core must read past (and the reserved ones it reads).
    request.parameters["tag"].string_param = "x"
    request.parameters["flag"].bool_param = True
    request.parameters["ratio"].double_param = 0.5
    request.parameters["priority"].uint64_param = 0
    request.parameters["timeout"].int64_param = 0
    if rng.integers(0, 2):
        request.outputs.add(name="OUTPUT0").parameters["binary_data"].bool_param = True
    expected = pb.ModelInferResponse(
        model_name=request.model_name, model_version="1", id=request_id
    )
    expected.outputs.add(name="OUTPUT0", datatype=datatype.name, shape=[rows, cols])
    expected.raw_output_contents.append(raw_bytes(datatype, values))
    return request, expected


@pytest.mark.parametrize("stream", [False, True])
async def test_random_requests_round_trip(
    schedulers: dict[str, ModelScheduler], stream: bool
) -> None:
    rng = np.random.default_rng(7)
    cases = []
    for _ in range(20):
        for name, datatype in DATATYPES.items():
            typed = name in CONTENTS_FIELD and bool(rng.integers(0, 2))
            cases.append((name, *request_for(rng, datatype, typed)))

    async def one(name: str, request: pb.ModelInferRequest) -> bytes:
        parsed = parse_infer_request(request.SerializeToString())
        assert (parsed.model_name, parsed.model_version, parsed.id) == (
            request.model_name,
            "",
            request.id,
        )
        answer, _ = await schedulers[name].infer_request(parsed, stream=stream)
        assert isinstance(answer, bytes)
        return answer

    answers = await asyncio.gather(*(one(name, request) for name, request, _ in cases))
    for (_, _, expected), answer in zip(cases, answers, strict=True):
        want = (
            pb.ModelStreamInferResponse(infer_response=expected) if stream else expected
        ).SerializeToString()
        assert answer == want


async def test_unknown_fields_and_unpacked_repeats_are_read(
    schedulers: dict[str, ModelScheduler],
) -> None:
    request = pb.ModelInferRequest(model_name="identity_int64", id="u")
    request.inputs.add(name="INPUT0", datatype="INT64", shape=[1, 2])
    request.raw_input_contents.append(np.array([3, -4], dtype=np.int64).tobytes())
    data = request.SerializeToString()
    # Field 99 (varint) and field 98 (length-delimited): unknown to inferd, skipped.
    data += bytes([0x98, 0x06, 0x2A, 0x92, 0x06, 0x02]) + b"hi"
    # The id again: the last value of a singular field wins.
    data += bytes([0x1A, 0x01]) + b"v"
    answer, _ = await schedulers["INT64"].infer_request(parse_infer_request(data))
    response = pb.ModelInferResponse.FromString(answer)
    assert response.id == "v"
    assert np.frombuffer(response.raw_output_contents[0], dtype=np.int64).tolist() == [3, -4]


@pytest.mark.parametrize(
    "data",
    [
        b"\x0a\x05ab",  # model_name claims 5 bytes, 2 remain
        b"\x0a\x02\xff\xfe",  # model_name not UTF-8
        b"\x2a\x03\x0a\x01",  # an input message cut inside
        b"\x0b",  # a group (wire type 3)
        b"\x08" + b"\xff" * 11,  # a varint that never ends
    ],
)
def test_malformed_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(InvalidArgument, match="malformed ModelInferRequest"):
        parse_infer_request(data)


def simple_request(**fields: Any) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name="identity_int32", **fields)


def typed(datatype: str, shape: list[int], field: str, values: list[Any]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model_name(datatype))
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return request


def with_shared_memory(byte_size: int | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="identity_int32")
    tensor = request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 1])
    tensor.parameters["shared_memory_region"].string_param = "r"
    if byte_size is not None:
        tensor.parameters["shared_memory_byte_size"].int64_param = byte_size
    return request


def raw_and_typed() -> pb.ModelInferRequest:
    request = typed("INT32", [1, 1], "int_contents", [1])
    request.raw_input_contents.append(bytes(4))
    return request


def raw_count_mismatch() -> pb.ModelInferRequest:
    request = simple_request(raw_input_contents=[bytes(4), bytes(4)])
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 1])
    return request


def bad_priority() -> pb.ModelInferRequest:
    request = typed("INT32", [1, 1], "int_contents", [1])
    request.parameters["priority"].int64_param = -1
    return request


def classification() -> pb.ModelInferRequest:
    request = typed("INT32", [1, 1], "int_contents", [1])
    request.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = 3
    return request


REFUSED: dict[str, tuple[Any, type[Exception], str, str]] = {
    "FP16 has no typed field": (
        lambda: typed("FP16", [1, 1], "fp32_contents", [1.0]),
        InvalidArgument,
        "FP16",
        "raw_input_contents",
    ),
    "INT8 out of range": (
        lambda: typed("INT8", [1, 2], "int_contents", [1, 300]),
        InvalidArgument,
        "INT8",
        "300",
    ),
    "UINT16 out of range": (
        lambda: typed("UINT16", [1, 1], "uint_contents", [70000]),
        InvalidArgument,
        "UINT16",
        "70000",
    ),
    "values in another type's field": (
        lambda: typed("INT64", [1, 2], "int_contents", [1, 2]),
        InvalidArgument,
        "int64_contents",
        "int_contents",
    ),
    "typed count differs from the shape": (
        lambda: typed("INT32", [2, 3], "int_contents", [1, 2, 3, 4, 5]),
        InvalidArgument,
        "5 values",
        "[2, 3]",
    ),
    "raw and typed together": (raw_and_typed, InvalidArgument, "INPUT0", "contents must not"),
    "raw count differs from inputs": (raw_count_mismatch, InvalidArgument, "2 entries", "1 inputs"),
    "shared memory without its byte size": (
        with_shared_memory,
        InvalidArgument,
        "INPUT0",
        "'shared_memory_byte_size' must be given",
    ),
    "shared memory where the caller may not use it": (
        lambda: with_shared_memory(4),
        PermissionDenied,
        "INPUT0",
        "not accepted on this listener",
    ),
    "classification": (classification, Unimplemented, "OUTPUT0", "classification"),
    "negative priority": (bad_priority, InvalidArgument, "priority", "non-negative"),
}


@pytest.mark.parametrize("case", list(REFUSED))
async def test_bad_requests_are_refused_by_the_core(
    schedulers: dict[str, ModelScheduler], case: str
) -> None:
    build, error, *says = REFUSED[case]
    request = build()
    parsed = parse_infer_request(request.SerializeToString())
    datatype = request.inputs[0].datatype
    with pytest.raises(error) as excinfo:
        await schedulers[datatype].infer_request(parsed)
    for text in says:
        assert text in str(excinfo.value)


def test_the_contents_table_is_the_protocol_s() -> None:
    table = {name: d.contents_field for name, d in DATATYPES.items() if d.contents_field}
    assert table == CONTENTS_FIELD
    assert [n for n, d in DATATYPES.items() if d.contents_field is None] == ["FP16", "BF16"]


# One value of each InferTensorContents field's type.
ONE_VALUE: dict[str, Any] = {
    "bool_contents": True,
    "int_contents": 1,
    "int64_contents": 1,
    "uint_contents": 1,
    "uint64_contents": 1,
    "fp32_contents": 1.0,
    "fp64_contents": 1.0,
    "bytes_contents": b"x",
}


@pytest.mark.parametrize("datatype", list(DATATYPES))
async def test_the_core_reads_a_datatype_from_its_contents_field_only(
    schedulers: dict[str, ModelScheduler], datatype: str
) -> None:
    """The core's own table of field numbers (cpp/src) against inferd.datatypes': a value in the
    datatype's field is served, a value in any other field is refused naming the input."""
    assert set(ONE_VALUE) == set(CONTENTS_FIELD.values())
    for field, value in ONE_VALUE.items():
        parsed = parse_infer_request(typed(datatype, [1, 1], field, [value]).SerializeToString())
        if field == DATATYPES[datatype].contents_field:
            answer, _ = await schedulers[datatype].infer_request(parsed)
            assert isinstance(answer, bytes)
            assert len(pb.ModelInferResponse.FromString(answer).raw_output_contents) == 1
        else:
            with pytest.raises(InvalidArgument, match="INPUT0"):
                await schedulers[datatype].infer_request(parsed)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (numbers below 16: one-byte keys)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


@pytest.mark.parametrize(
    ("datatype", "contents", "values"),
    [
        # Unpacked encodings (what proto2-style writers send): one key per value.
        ("FP32", b"".join(b"\x35" + np.float32(v).tobytes() for v in (1.5, -2.0)), [1.5, -2.0]),
        ("INT32", b"\x10\x07\x10\x7f", [7, 127]),
        ("BYTES", _field(8, b"ab") + _field(8, b"") + _field(8, b"xyz"), [b"ab", b"", b"xyz"]),
    ],
)
async def test_unpacked_typed_contents_are_read(
    schedulers: dict[str, ModelScheduler], datatype: str, contents: bytes, values: list[Any]
) -> None:
    tensor = (
        _field(1, b"INPUT0")
        + _field(2, datatype.encode())
        + _field(3, bytes([1, len(values)]))
        + _field(5, contents)
    )
    data = _field(1, model_name(datatype).encode()) + _field(5, tensor)
    answer, _ = await schedulers[datatype].infer_request(parse_infer_request(data))
    response = pb.ModelInferResponse.FromString(answer)
    assert response.raw_output_contents[0] == raw_bytes(DATATYPES[datatype], values)


def test_a_request_may_not_name_more_tensors_than_the_parser_bounds() -> None:
    """Parsing costs memory per tensor and parameter however small they are on the wire: a
    request holds at most 4096 of each kind (far above any model's)."""
    many_inputs = b"\x2a\x00" * 4097  # empty input messages: 2 bytes each
    with pytest.raises(InvalidArgument, match="more than 4096 inputs"):
        parse_infer_request(many_inputs)
    parse_infer_request(b"\x2a\x00" * 4096)
    many_parameters = _field(4, _field(1, b"k")) * 4097
    with pytest.raises(InvalidArgument, match="parameters"):
        parse_infer_request(many_parameters)
