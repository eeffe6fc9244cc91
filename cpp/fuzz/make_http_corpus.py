"""Write the seed corpus of http_request_fuzzer: HTTP/REST inference request bodies.

Usage: ``python cpp/fuzz/make_http_corpus.py OUT_DIR`` (run by ``make fuzz-build``).

Each seed is what the harness reads: one byte picking the model (0 all_types, 1 batch_int32,
2 reshape_fp32, 3 bytes_text; see http_request_fuzzer.cpp), the Inference-Header-Content-Length
as four little-endian bytes (0xFFFFFFFF: none, the body is all JSON), then the body. The bodies
are written as tritonclient.http writes them (``_get_inference_request``: binary inputs with
``binary_data_size``, ``binary_data_output`` when no output is requested, ``binary_data`` on
requested outputs) and as a JSON client does (flat and nested ``data``), for every datatype, with
shared-memory inputs and outputs and parameters of every kind; a few are refusals (too deep, a
header length that lies), as starting points for the error paths. Nothing here is committed: the
corpus is generated.
"""

from __future__ import annotations

import json
import pathlib
import struct
import sys
from typing import Any

ALL_TYPES, BATCH_INT32, RESHAPE_FP32, BYTES_TEXT = range(4)
NO_HEADER = 0xFFFFFFFF

# datatype -> (struct format of one element, a few values JSON can carry)
JSON_VALUES: dict[str, tuple[str, list[Any]]] = {
    "BOOL": ("?", [True, False]),
    "UINT8": ("B", [0, 255]),
    "UINT16": ("H", [1, 65535]),
    "UINT32": ("I", [7, 4294967295]),
    "UINT64": ("Q", [0, 18446744073709551615]),
    "INT8": ("b", [-128, 127]),
    "INT16": ("h", [-32768, 5]),
    "INT32": ("i", [-2147483648, 2147483647]),
    "INT64": ("q", [-9223372036854775808, 9223372036854775807]),
    "FP32": ("f", [0.1, -2.5]),
    "FP64": ("d", [1e-300, 3.25]),
}


def seed(
    model: int, json_body: dict[str, Any] | str, binary: bytes = b"", header: int | None = None
) -> bytes:
    text = (json_body if isinstance(json_body, str) else json.dumps(json_body)).encode()
    if header is None:
        header = len(text) if binary else NO_HEADER
    return bytes([model]) + struct.pack("<I", header) + text + binary


def bytes_tensor(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def seeds() -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for datatype, (fmt, values) in JSON_VALUES.items():
        flat = {
            "inputs": [{"name": datatype, "shape": [1, 2], "datatype": datatype, "data": values}]
        }
        nested = {
            "inputs": [{"name": datatype, "shape": [1, 2], "datatype": datatype, "data": [values]}],
            "outputs": [{"name": "OUT_" + datatype, "parameters": {"binary_data": False}}],
        }
        raw = struct.pack("<" + fmt * len(values), *values)
        binary = {
            "inputs": [
                {
                    "name": datatype,
                    "shape": [1, 2],
                    "datatype": datatype,
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
        out[f"json-flat-{datatype}"] = seed(ALL_TYPES, flat)
        out[f"json-nested-{datatype}"] = seed(ALL_TYPES, nested)
        out[f"binary-{datatype}"] = seed(ALL_TYPES, binary, raw)
    for datatype in ("FP16", "BF16"):
        raw = b"\x00\x3c\x00\x40"
        out[f"binary-{datatype}"] = seed(
            ALL_TYPES,
            {
                "inputs": [
                    {
                        "name": datatype,
                        "shape": [1, 2],
                        "datatype": datatype,
                        "parameters": {"binary_data_size": 4},
                    }
                ],
                "outputs": [{"name": "OUT_" + datatype, "parameters": {"binary_data": True}}],
            },
            raw,
        )
    text = ["héllo", "", "wörld"]
    out["json-bytes"] = seed(
        BYTES_TEXT,
        {
            "id": "s1",
            "inputs": [{"name": "TEXT", "shape": [1, 3], "datatype": "BYTES", "data": [text]}],
            "parameters": {
                "tag": "t",
                "n": -1,
                "big": 18446744073709551615,
                "x": 0.5,
                "flag": True,
            },
        },
    )
    raw_text = bytes_tensor([t.encode() for t in text])
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "TEXT",
                    "shape": [1, 3],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(raw_text)},
                }
            ],
            "outputs": [{"name": "TEXT_OUT", "parameters": {"binary_data": False}}],
        }
    )
    out["binary-bytes"] = seed(BYTES_TEXT, body, raw_text)

    ints = list(range(8))
    mixed = {
        "id": "42",
        "inputs": [
            {"name": "INPUT0", "shape": [2, 4], "datatype": "INT32", "data": [ints[:4], ints[4:]]},
            {
                "name": "INPUT1",
                "shape": [2, 4],
                "datatype": "INT32",
                "parameters": {"binary_data_size": 32},
            },
        ],
        "outputs": [{"name": "OUTPUT1", "parameters": {"binary_data": True}}, {"name": "OUTPUT0"}],
        "parameters": {"priority": 1, "timeout": 1000},
    }
    out["mixed"] = seed(BATCH_INT32, mixed, struct.pack("<8i", *ints))
    shm = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 4],
                "datatype": "INT32",
                "parameters": {"shared_memory_region": "region0", "shared_memory_byte_size": 16},
            },
            {"name": "INPUT1", "shape": [1, 4], "datatype": "INT32", "data": [1, 2, 3, 4]},
        ],
        "outputs": [
            {
                "name": "OUTPUT0",
                "parameters": {
                    "shared_memory_region": "region0",
                    "shared_memory_byte_size": 16,
                    "shared_memory_offset": 64,
                    "binary_data": False,
                },
            },
            {"name": "OUTPUT1"},
        ],
    }
    out["shared-memory"] = seed(BATCH_INT32, shm)
    out["reshape"] = seed(
        RESHAPE_FP32,
        {"inputs": [{"name": "INPUT0", "shape": [2, 4], "datatype": "FP32", "data": [0.5] * 8}]},
    )
    out["scalar-shape"] = seed(
        ALL_TYPES, {"inputs": [{"name": "INT32", "shape": [], "datatype": "INT32", "data": 3}]}
    )

    # Refusals.
    out["too-deep"] = seed(ALL_TYPES, "[" * 200 + "]" * 200)
    out["lying-header"] = seed(
        BATCH_INT32, json.dumps(mixed), struct.pack("<8i", *ints), header=1 << 20
    )
    out["short-header"] = seed(BATCH_INT32, json.dumps(mixed), struct.pack("<8i", *ints), header=40)
    out["count-mismatch"] = seed(
        ALL_TYPES,
        {"inputs": [{"name": "INT8", "shape": [1, 3], "datatype": "INT8", "data": [1, 2]}]},
    )
    out["fp16-json"] = seed(
        ALL_TYPES,
        {"inputs": [{"name": "FP16", "shape": [1, 1], "datatype": "FP16", "data": [1.0]}]},
    )
    return out


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_http_corpus.py OUT_DIR")
    directory = pathlib.Path(sys.argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in seeds().items():
        (directory / name).write_bytes(data)


if __name__ == "__main__":
    main()
