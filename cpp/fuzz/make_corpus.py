"""Write the seed corpus of infer_request_fuzzer: real serialized ModelInferRequests.

Usage: ``python cpp/fuzz/make_corpus.py OUT_DIR`` (run by ``make fuzz`` and ``make fuzz-ci``).

The requests name the models the harness knows (batch_int32, reshape_fp32, reshape_var_fp32,
bytes_text, all_types; see infer_request_fuzzer.cpp), so that most of them build, and cover
every datatype (typed contents and raw), BYTES, parameters of every kind, requested outputs with
parameters, unknown fields, merged (repeated) fields and the requests a stream carries. A few
are requests the core must refuse, as starting points for the error paths. Nothing here is
committed: the corpus is generated.
"""

from __future__ import annotations

import importlib
import pathlib
import struct
import sys
import tempfile
from types import ModuleType
from typing import Any


def load_pb2() -> ModuleType:
    """inferd's generated module, else tritonclient's (wire-identical), else compiled here."""
    for name in ("inferd._proto.grpc_service_pb2", "tritonclient.grpc.service_pb2"):
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
    protoc = importlib.import_module("grpc_tools.protoc")
    proto_dir = pathlib.Path(__file__).resolve().parents[2] / "proto"
    out = tempfile.mkdtemp(prefix="inferd-fuzz-proto-")
    protos = [str(proto_dir / "grpc_service.proto"), str(proto_dir / "model_config.proto")]
    if protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out}", *protos]) != 0:
        raise SystemExit("make_corpus: protoc failed on proto/grpc_service.proto")
    sys.path.insert(0, out)
    return importlib.import_module("grpc_service_pb2")


def load_datatypes() -> dict[str, Any]:
    """inferd.datatypes' table (the one statement of each datatype's contents field): the
    installed package's, else the source tree's (it needs only numpy)."""
    try:
        module = importlib.import_module("inferd.datatypes")
    except ImportError:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
        module = importlib.import_module("inferd.datatypes")
    table: dict[str, Any] = module.DATATYPES
    return table


pb = load_pb2()
Request = pb.ModelInferRequest
TABLE = load_datatypes()

# --- wire helpers, for what protobuf's serializer never writes --------------------------------


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


def ld(field: int, payload: bytes) -> bytes:
    return key(field, 2) + varint(len(payload)) + payload


# Unknown fields of each wire type (numbers no message of the protocol uses).
UNKNOWN = (
    key(99, 0)
    + varint(12345)
    + key(100, 1)
    + b"\x01" * 8
    + key(101, 5)
    + b"\x02" * 4
    + ld(102, b"future field")
)

# --- values of each datatype, typed (the contents field, values) and raw (little-endian) -------

TYPED_FIELD = {name: d.contents_field for name, d in TABLE.items() if d.contents_field}
VALUES: dict[str, list[Any]] = {
    "BOOL": [True, False, True],
    "INT8": [-128, 0, 127],
    "INT16": [-32768, 1, 32767],
    "INT32": [-(2**31), -1, 2**31 - 1],
    "INT64": [-(2**63), -1, 2**63 - 1],
    "UINT8": [0, 1, 255],
    "UINT16": [0, 300, 65535],
    "UINT32": [0, 70000, 2**32 - 1],
    "UINT64": [0, 2**40, 2**64 - 1],
    "FP16": [0.5, -2.0, 65504.0],
    "FP32": [1.5, -0.0, 3.4e38],
    "FP64": [2.5, -1e300, 5e-324],
    "BF16": [1.0, -3.0, 0.15625],
    "BYTES": [b"hello", b"", "h\u00e9llo w\u00f6rld".encode()],
}
FORMAT = {
    "BOOL": "?",
    "INT8": "b",
    "INT16": "h",
    "INT32": "i",
    "INT64": "q",
    "UINT8": "B",
    "UINT16": "H",
    "UINT32": "I",
    "UINT64": "Q",
    "FP16": "e",
    "FP32": "f",
    "FP64": "d",
}
DATATYPES = list(VALUES)


def raw(datatype: str, values: list[Any]) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in values)
    if datatype == "BF16":  # the top half of each float32
        return b"".join(struct.pack("<f", v)[2:] for v in values)
    return struct.pack(f"<{len(values)}{FORMAT[datatype]}", *values)


def add_input(
    request: Any, name: str, datatype: str, shape: list[int], values: list[Any] | None = None
) -> Any:
    tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
    if values is not None:
        getattr(tensor.contents, TYPED_FIELD[datatype]).extend(values)
    return tensor


def set_parameter(parameters: Any, name: str, value: Any) -> None:
    if isinstance(value, bool):
        parameters[name].bool_param = value
    elif isinstance(value, tuple):  # ("uint64", n)
        parameters[name].uint64_param = value[1]
    elif isinstance(value, int):
        parameters[name].int64_param = value
    elif isinstance(value, float):
        parameters[name].double_param = value
    else:
        parameters[name].string_param = value


EVERY_KIND = {
    "flag": True,
    "count": -7,
    "label": "caf\u00e9",
    "ratio": 0.25,
    "big": ("uint64", 2**64 - 1),
}


def seeds() -> dict[str, bytes]:
    out: dict[str, bytes] = {}

    def put(name: str, request: Any, extra: bytes = b"") -> None:
        out[name] = request.SerializeToString() + extra

    # batch_int32: INPUT0, INPUT1 INT32 [-1, 16], max_batch_size 8; OUTPUT0, OUTPUT1.
    rows = [[r * 16 + c - 40 for c in range(16)] for r in range(2)]
    flat = [v for row in rows for v in row]
    r = Request(model_name="batch_int32", model_version="1", id="req-typed")
    add_input(r, "INPUT0", "INT32", [2, 16], flat)
    add_input(r, "INPUT1", "INT32", [2, 16], [-v for v in flat])
    o = r.outputs.add(name="OUTPUT1")
    set_parameter(o.parameters, "binary_data", True)
    r.outputs.add(name="OUTPUT0")
    for k, v in EVERY_KIND.items():
        set_parameter(r.parameters, k, v)
    set_parameter(r.parameters, "priority", ("uint64", 1))
    set_parameter(r.parameters, "timeout", 5000)
    put("batch_int32_typed", r)

    r = Request(model_name="batch_int32", id="req-raw")
    add_input(r, "INPUT0", "INT32", [1, 16])
    add_input(r, "INPUT1", "INT32", [1, 16])
    r.raw_input_contents.extend([raw("INT32", flat[:16]), raw("INT32", flat[16:])])
    o = r.outputs.add(name="OUTPUT0")
    for k, v in EVERY_KIND.items():
        set_parameter(o.parameters, k, v)
    put("batch_int32_raw", r)

    r = Request(model_name="batch_int32", id="batch-mismatch")
    add_input(r, "INPUT0", "INT32", [2, 16], flat)
    add_input(r, "INPUT1", "INT32", [1, 16], flat[:16])
    put("batch_int32_refused_batch_mismatch", r)

    # The same request with INPUT0's shape unpacked (two varint fields, as old encoders write it).
    t = pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="INT32")
    t.contents.int_contents.extend(flat[:16])
    unpacked = t.SerializeToString() + key(3, 0) + varint(1) + key(3, 0) + varint(16)
    r = Request(model_name="batch_int32")
    add_input(r, "INPUT1", "INT32", [1, 16], flat[16:])
    out["batch_int32_unpacked_shape"] = r.SerializeToString() + ld(5, unpacked)

    # Unknown fields at every level: request, input, contents, parameter (entry and value), output.
    r = Request(model_name="batch_int32", id="unknown-fields")
    add_input(r, "INPUT1", "INT32", [1, 16], flat[:16])
    t = pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="INT32", shape=[1, 16])
    c = pb.InferTensorContents(int_contents=flat[16:])
    value = pb.InferParameter(int64_param=3).SerializeToString() + UNKNOWN
    entry = ld(1, b"p") + ld(2, value) + UNKNOWN
    t_bytes = (
        t.SerializeToString() + ld(4, entry) + ld(5, c.SerializeToString() + UNKNOWN) + UNKNOWN
    )
    o_bytes = ld(1, b"OUTPUT0") + UNKNOWN
    out["batch_int32_unknown_fields"] = (
        r.SerializeToString() + ld(5, t_bytes) + ld(6, o_bytes) + UNKNOWN
    )

    # Fields given twice: the last id wins, a map key given twice keeps the last value, and
    # contents given twice are merged (protobuf's rules for concatenated messages).
    r = Request(model_name="batch_int32", id="first-id")
    add_input(r, "INPUT0", "INT32", [1, 16], flat[:16])
    add_input(r, "INPUT1", "INT32", [1, 16], flat[:16])
    set_parameter(r.parameters, "priority", 2)
    again = Request(id="second-id")
    set_parameter(again.parameters, "priority", ("uint64", 1))
    out["batch_int32_repeated_fields"] = r.SerializeToString() + again.SerializeToString()
    t = pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="INT32", shape=[1, 16])
    halves = ld(5, pb.InferTensorContents(int_contents=flat[:8]).SerializeToString()) + ld(
        5, pb.InferTensorContents(int_contents=flat[8:16]).SerializeToString()
    )
    r = Request(model_name="batch_int32")
    add_input(r, "INPUT1", "INT32", [1, 16], flat[:16])
    merged = ld(5, t.SerializeToString() + halves)
    out["batch_int32_contents_merged"] = r.SerializeToString() + merged

    # What a stream carries: ids, and the parameters Triton's clients send on ModelStreamInfer.
    for i, start in enumerate((True, False)):
        r = Request(model_name="batch_int32", id=f"stream-{i}")
        add_input(r, "INPUT0", "INT32", [1, 16], flat[:16])
        add_input(r, "INPUT1", "INT32", [1, 16], flat[16:])
        set_parameter(r.parameters, "triton_enable_empty_final_response", True)
        set_parameter(r.parameters, "sequence_id", ("uint64", 42))
        set_parameter(r.parameters, "sequence_start", start)
        set_parameter(r.parameters, "sequence_end", not start)
        put(f"batch_int32_stream_{i}", r)

    # Shared memory: the harness registers one system region, "region0" (4096 bytes, filled from
    # the request's own bytes). Inputs and outputs in it, mixed with raw inputs (raw_input_contents
    # then holds only the others), and the refusals around it.
    def in_region(tensor: Any, size: int, offset: Any = None, region: Any = "region0") -> None:
        set_parameter(tensor.parameters, "shared_memory_region", region)
        set_parameter(tensor.parameters, "shared_memory_byte_size", size)
        if offset is not None:
            set_parameter(tensor.parameters, "shared_memory_offset", offset)

    r = Request(model_name="batch_int32", id="shm-mixed")
    in_region(add_input(r, "INPUT0", "INT32", [1, 16]), 64, 0)
    add_input(r, "INPUT1", "INT32", [1, 16])
    r.raw_input_contents.append(raw("INT32", flat[:16]))
    in_region(r.outputs.add(name="OUTPUT0"), 64, ("uint64", 1024))
    r.outputs.add(name="OUTPUT1")
    put("batch_int32_shared_memory_mixed", r)
    r = Request(model_name="batch_int32", id="shm-all")
    in_region(add_input(r, "INPUT0", "INT32", [2, 16]), 128, 128)
    in_region(add_input(r, "INPUT1", "INT32", [2, 16]), 128, 256)
    in_region(r.outputs.add(name="OUTPUT0"), 128, 2048)
    in_region(r.outputs.add(name="OUTPUT1"), 128, 4096 - 128)
    put("batch_int32_shared_memory_all", r)
    r = Request(model_name="bytes_text", id="shm-bytes")
    in_region(add_input(r, "TEXT", "BYTES", [1, 3]), 12, 4000)
    put("bytes_text_shared_memory", r)
    r = Request(model_name="all_types", id="shm-fp64")
    in_region(add_input(r, "FP64", "FP64", [1, 3]), 24, 8)
    in_region(r.outputs.add(name="OUT_FP64"), 24, 512)
    put("all_types_shared_memory_fp64", r)
    refusals: dict[str, tuple[int, Any, Any]] = {
        "unknown_region": (64, 0, "no-such-region"),
        "past_the_end": (64, 4096 - 32, "region0"),
        "offset_overflow": (64, ("uint64", 2**64 - 16), "region0"),
        "negative_offset": (64, -1, "region0"),
        "too_small": (60, 0, "region0"),
        "region_not_a_string": (64, 0, 7),
    }
    for name, (size, offset, region) in refusals.items():
        r = Request(model_name="batch_int32")
        in_region(add_input(r, "INPUT0", "INT32", [1, 16]), size, offset, region)
        add_input(r, "INPUT1", "INT32", [1, 16], flat[:16])
        put(f"batch_int32_refused_shared_memory_{name}", r)
    r = Request(model_name="batch_int32")  # raw contents for an input in shared memory too
    in_region(add_input(r, "INPUT0", "INT32", [1, 16]), 64)
    add_input(r, "INPUT1", "INT32", [1, 16])
    r.raw_input_contents.extend([raw("INT32", flat[:16]), raw("INT32", flat[16:])])
    put("batch_int32_refused_shared_memory_raw_count", r)
    r = Request(model_name="batch_int32")  # an output slice too small for its output
    add_input(r, "INPUT0", "INT32", [1, 16], flat[:16])
    add_input(r, "INPUT1", "INT32", [1, 16], flat[:16])
    in_region(r.outputs.add(name="OUTPUT0"), 16, 0)
    put("batch_int32_refused_shared_memory_output_too_small", r)

    # Refused with UNIMPLEMENTED: classification.
    r = Request(model_name="batch_int32")
    add_input(r, "INPUT0", "INT32", [1, 16], flat[:16])
    add_input(r, "INPUT1", "INT32", [1, 16], flat[:16])
    set_parameter(r.outputs.add(name="OUTPUT0").parameters, "classification", 3)
    put("batch_int32_refused_classification", r)

    # reshape_fp32: FP32 [-1, 4] reshaped to [-1, 2, 2], not batching.
    floats = [0.5 * i - 3 for i in range(12)]
    r = Request(model_name="reshape_fp32", id="reshape-typed")
    add_input(r, "INPUT0", "FP32", [3, 4], floats)
    r.outputs.add(name="OUTPUT0")
    put("reshape_fp32_typed", r)
    r = Request(model_name="reshape_fp32")
    add_input(r, "INPUT0", "FP32", [3, 4])
    r.raw_input_contents.append(raw("FP32", floats))
    put("reshape_fp32_raw", r)
    r = Request(model_name="reshape_fp32")
    add_input(r, "INPUT0", "FP32", [0, 4])
    r.raw_input_contents.append(b"")
    put("reshape_fp32_empty", r)

    # reshape_var_fp32: FP32 [-1] reshaped to [-1, 2], max_batch_size 4.
    r = Request(model_name="reshape_var_fp32", id="reshape-var")
    add_input(r, "INPUT0", "FP32", [2, 4], floats[:8])
    put("reshape_var_fp32_typed", r)
    r = Request(model_name="reshape_var_fp32")
    add_input(r, "INPUT0", "FP32", [1, 6])
    r.raw_input_contents.append(raw("FP32", floats[:6]))
    r.outputs.add(name="OUTPUT0")
    put("reshape_var_fp32_raw", r)

    # bytes_text: TEXT BYTES [-1] (UTF-8), EXTRA BYTES [2] optional; max_batch_size 4.
    text = VALUES["BYTES"]
    r = Request(model_name="bytes_text", model_version="2", id="text-typed")
    add_input(r, "TEXT", "BYTES", [1, 3], text)
    put("bytes_text_typed", r)
    r = Request(model_name="bytes_text", id="text-raw")
    add_input(r, "TEXT", "BYTES", [1, 3])
    add_input(r, "EXTRA", "BYTES", [1, 2])
    r.raw_input_contents.extend([raw("BYTES", text), raw("BYTES", [b"\xff\xfe", b"\x00"])])
    r.outputs.add(name="EXTRA_OUT")
    r.outputs.add(name="TEXT_OUT")
    put("bytes_text_raw_optional", r)
    r = Request(model_name="bytes_text")
    add_input(r, "TEXT", "BYTES", [1, 1])
    r.raw_input_contents.append(raw("BYTES", [b"\xc3\x28"]))
    put("bytes_text_refused_not_utf8", r)
    r = Request(model_name="bytes_text")
    add_input(r, "TEXT", "BYTES", [1, 2])
    r.raw_input_contents.append(raw("BYTES", [b"ab", b"cd"])[:-3])
    put("bytes_text_refused_truncated", r)

    # all_types: one optional input per datatype, named after it, [-1]; max_batch_size 16.
    everything_typed = Request(model_name="all_types", model_version="3", id="every-typed")
    everything_raw = Request(model_name="all_types", id="every-raw")
    for datatype in DATATYPES:
        values = VALUES[datatype]
        shape = [1, len(values)]
        if datatype in TYPED_FIELD:
            r = Request(model_name="all_types", id=f"typed-{datatype}")
            add_input(r, datatype, datatype, shape, values)
            r.outputs.add(name="OUT_" + datatype)
            put(f"all_types_typed_{datatype}", r)
            add_input(everything_typed, datatype, datatype, shape, values)
        r = Request(model_name="all_types", id=f"raw-{datatype}")
        add_input(r, datatype, datatype, shape)
        r.raw_input_contents.append(raw(datatype, values))
        put(f"all_types_raw_{datatype}", r)
        add_input(everything_raw, datatype, datatype, shape)
        everything_raw.raw_input_contents.append(raw(datatype, values))
    put("all_types_typed_every", everything_typed)
    put("all_types_raw_every", everything_raw)

    # Range errors and a typed FP16 (which has no contents field).
    out_of_range = {"INT8": [128], "INT16": [-32769], "UINT8": [256], "UINT16": [65536]}
    for datatype, bad in out_of_range.items():
        r = Request(model_name="all_types")
        add_input(r, datatype, datatype, [1, 1], bad)
        put(f"all_types_refused_range_{datatype}", r)
    r = Request(model_name="all_types")
    t = add_input(r, "FP16", "FP16", [1, 2])
    t.contents.fp32_contents.extend([1.0, 2.0])
    put("all_types_refused_typed_fp16", r)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = pathlib.Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = seeds()
    for name, data in corpus.items():
        (out_dir / f"seed-{name}").write_bytes(data)
    print(f"make_corpus: {len(corpus)} requests in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
