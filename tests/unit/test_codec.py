"""Protocol messages <-> inferd's request and response types."""

from __future__ import annotations

import numpy as np
import pytest

import inferd._proto.grpc_service_pb2 as pb
from inferd.datatypes import DATATYPES, count_bytes_elements, serialize_bytes
from inferd.errors import InvalidArgument, Unimplemented
from inferd.tensors import InferResponse, Tensor
from inferd.transport import codec


def request(**fields: object) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name="m", **fields)


def test_raw_inputs_are_kept_as_sent() -> None:
    msg = request(id="7", raw_input_contents=[b"\x01\x00\x00\x00"])
    msg.inputs.add(name="X", datatype="INT32", shape=[1, 1])
    msg.outputs.add(name="Y")
    msg.parameters["priority"].uint64_param = 2
    msg.parameters["tag"].string_param = "a"
    decoded = codec.decode_infer_request(msg)
    assert decoded.id == "7"
    assert decoded.inputs == [Tensor("X", "INT32", (1, 1), b"\x01\x00\x00\x00")]
    assert decoded.outputs == ["Y"]
    assert decoded.parameters == {"priority": 2, "tag": "a"}


@pytest.mark.parametrize(
    ("datatype", "field", "values"),
    [
        ("BOOL", "bool_contents", [True, False]),
        ("INT8", "int_contents", [-128, 127]),
        ("INT16", "int_contents", [-3, 4]),
        ("INT32", "int_contents", [-(2**31), 2**31 - 1]),
        ("INT64", "int64_contents", [-(2**63), 2**63 - 1]),
        ("UINT8", "uint_contents", [0, 255]),
        ("UINT16", "uint_contents", [1, 65535]),
        ("UINT32", "uint_contents", [0, 2**32 - 1]),
        ("UINT64", "uint64_contents", [0, 2**64 - 1]),
        ("FP32", "fp32_contents", [1.5, -2.25]),
        ("FP64", "fp64_contents", [1e300, -0.5]),
    ],
)
def test_typed_contents_become_raw_bytes(datatype: str, field: str, values: list[object]) -> None:
    msg = request()
    tensor = msg.inputs.add(name="X", datatype=datatype, shape=[2])
    getattr(tensor.contents, field).extend(values)
    decoded = codec.decode_infer_request(msg)
    expected = np.array(values, dtype=DATATYPES[datatype].numpy).tobytes()
    assert decoded.inputs[0].data == expected


def test_typed_bytes_contents_are_serialized() -> None:
    msg = request()
    msg.inputs.add(name="S", datatype="BYTES", shape=[2]).contents.bytes_contents.extend(
        [b"ab", b""]
    )
    data = codec.decode_infer_request(msg).inputs[0].data
    assert data == serialize_bytes([b"ab", b""])
    assert count_bytes_elements(data) == 2


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_types_have_no_typed_field(datatype: str) -> None:
    msg = request()
    msg.inputs.add(name="H", datatype=datatype, shape=[1])
    with pytest.raises(InvalidArgument, match="raw_input_contents"):
        codec.decode_infer_request(msg)


def test_out_of_range_typed_values_are_refused() -> None:
    msg = request()
    msg.inputs.add(name="X", datatype="INT8", shape=[1]).contents.int_contents.append(300)
    with pytest.raises(InvalidArgument, match="INT8"):
        codec.decode_infer_request(msg)


def test_raw_and_contents_together_are_refused() -> None:
    msg = request(raw_input_contents=[b"\x00" * 4])
    msg.inputs.add(name="X", datatype="INT32", shape=[1]).contents.int_contents.append(1)
    with pytest.raises(InvalidArgument, match="contents must not be set"):
        codec.decode_infer_request(msg)


def test_raw_count_must_match_inputs() -> None:
    msg = request(raw_input_contents=[b"", b""])
    msg.inputs.add(name="X", datatype="INT32", shape=[0])
    with pytest.raises(InvalidArgument, match="2 entries for 1 inputs"):
        codec.decode_infer_request(msg)


def test_unknown_datatype_and_shared_memory() -> None:
    msg = request()
    msg.inputs.add(name="X", datatype="FP8", shape=[1])
    with pytest.raises(InvalidArgument, match="FP8"):
        codec.decode_infer_request(msg)
    msg = request()
    msg.inputs.add(name="X", datatype="INT32", shape=[1]).parameters[
        "shared_memory_region"
    ].string_param = "r"
    with pytest.raises(Unimplemented, match="shared-memory"):
        codec.decode_infer_request(msg)


def test_outputs_travel_raw_in_order() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.frombuffer(serialize_bytes([b"x", b"yz"]), dtype=np.uint8)
    response = InferResponse(
        "m", "1", "id", [Tensor("A", "FP32", (2, 3), a), Tensor("B", "BYTES", (2,), b)]
    )
    msg = codec.encode_infer_response(response)
    assert [(o.name, o.datatype, list(o.shape)) for o in msg.outputs] == [
        ("A", "FP32", [2, 3]),
        ("B", "BYTES", [2]),
    ]
    assert msg.raw_output_contents[0] == a.tobytes()
    assert msg.raw_output_contents[1] == serialize_bytes([b"x", b"yz"])
    assert (msg.id, msg.model_version) == ("id", "1")


def test_malformed_bytes_are_detected() -> None:
    with pytest.raises(ValueError, match="truncated"):
        count_bytes_elements(b"\x01\x00")
    with pytest.raises(ValueError, match="needs 5 bytes"):
        count_bytes_elements(b"\x05\x00\x00\x00ab")
