"""The datatype table agrees with ONNX's and the model config's own enums."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import inferd._proto.model_config_pb2 as model_config_pb2
from inferd.datatypes import DATATYPES

ONNX_NAMES = {
    "BOOL": "BOOL", "UINT8": "UINT8", "UINT16": "UINT16", "UINT32": "UINT32", "UINT64": "UINT64",
    "INT8": "INT8", "INT16": "INT16", "INT32": "INT32", "INT64": "INT64", "FP16": "FLOAT16",
    "FP32": "FLOAT", "FP64": "DOUBLE", "BYTES": "STRING", "BF16": "BFLOAT16",
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(DATATYPES))
def test_each_row_matches_onnx_and_the_config_enum(name: str) -> None:
    row = DATATYPES[name]
    assert row.onnx_type == getattr(TensorProto, ONNX_NAMES[name])
    assert model_config_pb2.DataType.Value(row.config_name) == row.config_type
    if not row.is_bytes:
        assert row.numpy.itemsize == row.itemsize
        assert row.numpy.byteorder in ("<", "=", "|")
    assert np.dtype(row.numpy).kind in "biuf"
