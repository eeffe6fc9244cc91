"""The protocol's tensor datatypes and how each is held in memory.

One row per datatype: its protocol name ("FP32"), its model-config enum value (TYPE_FP32 = 11,
also the core's DataType code), its numpy dtype, its ONNX element type and the InferTensorContents
field that carries it typed on the wire. BYTES has no fixed width: it is carried serialized, each
element a 4-byte little-endian length and its bytes, as on the wire.
BF16 has no numpy dtype: its raw 16-bit patterns are carried as uint16.

The contents fields are decoded by the core (cpp/src, its own table of field numbers); this is the
one Python statement of them, for the tests and the fuzz corpus (cpp/fuzz/make_corpus.py), and
tests/unit/test_wire.py checks the core against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np


@dataclass(frozen=True)
class Datatype:
    name: str  # the protocol's string, e.g. "FP32"
    config_type: int  # inference.DataType in model_config.proto, e.g. 11 for TYPE_FP32
    numpy: np.dtype[np.generic]  # little-endian storage dtype; uint8 for BYTES' serialized form
    itemsize: int  # bytes per element, 0 for BYTES
    onnx_type: int  # onnx.TensorProto element type (ONNX strings carry BYTES)
    # The InferTensorContents field of its typed values, e.g. "int_contents" for INT8; None for
    # FP16 and BF16, which the protocol carries raw only.
    contents_field: str | None

    @property
    def is_bytes(self) -> bool:
        return self.itemsize == 0

    @property
    def config_name(self) -> str:
        """The model-config enum name: TYPE_FP32, ..., TYPE_STRING for BYTES."""
        return "TYPE_STRING" if self.is_bytes else f"TYPE_{self.name}"


def _row(
    name: str, config_type: int, dtype: str, itemsize: int, onnx_type: int, contents: str | None
) -> Datatype:
    return Datatype(name, config_type, np.dtype(dtype), itemsize, onnx_type, contents)


DATATYPES: Final[dict[str, Datatype]] = {
    d.name: d
    for d in (
        _row("BOOL", 1, "?", 1, 9, "bool_contents"),
        _row("UINT8", 2, "<u1", 1, 2, "uint_contents"),
        _row("UINT16", 3, "<u2", 2, 4, "uint_contents"),
        _row("UINT32", 4, "<u4", 4, 12, "uint_contents"),
        _row("UINT64", 5, "<u8", 8, 13, "uint64_contents"),
        _row("INT8", 6, "<i1", 1, 3, "int_contents"),
        _row("INT16", 7, "<i2", 2, 5, "int_contents"),
        _row("INT32", 8, "<i4", 4, 6, "int_contents"),
        _row("INT64", 9, "<i8", 8, 7, "int64_contents"),
        _row("FP16", 10, "<f2", 2, 10, None),
        _row("FP32", 11, "<f4", 4, 1, "fp32_contents"),
        _row("FP64", 12, "<f8", 8, 11, "fp64_contents"),
        _row("BYTES", 13, "<u1", 0, 8, "bytes_contents"),
        _row("BF16", 14, "<u2", 2, 16, None),
    )
}
BY_CONFIG_TYPE: Final[dict[int, Datatype]] = {d.config_type: d for d in DATATYPES.values()}
BY_ONNX_TYPE: Final[dict[int, Datatype]] = {d.onnx_type: d for d in DATATYPES.values()}


def serialize_bytes(elements: list[bytes]) -> bytes:
    """Elements -> the protocol's BYTES form (4-byte little-endian length, then the bytes)."""
    parts: list[bytes] = []
    for element in elements:
        parts.append(len(element).to_bytes(4, "little"))
        parts.append(element)
    return b"".join(parts)
