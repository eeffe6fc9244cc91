"""Writes onnxruntime_test_model.onnx, the model cpp/tests/onnxruntime_executor_test.cpp runs
(GoogleTest has no Python at test time, so the model is kept beside it). Rerun after a change:
    .venv/bin/python cpp/tests/data/onnxruntime_test_model.py

X FP32 [batch, 4] + Y FP32 [4] (optional: an initializer, default 1 2 3 4) -> Z FP32
S STRING [batch] -> S_OUT (Identity); H FP16 [batch, 2] -> H_OUT (Identity)
"""

import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

graph = helper.make_graph(
    [
        helper.make_node("Add", ["X", "Y"], ["Z"]),
        helper.make_node("Identity", ["S"], ["S_OUT"]),
        helper.make_node("Identity", ["H"], ["H_OUT"]),
    ],
    "onnxruntime_test_model",
    [
        helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4]),
        helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4]),
        helper.make_tensor_value_info("S", TensorProto.STRING, ["batch"]),
        helper.make_tensor_value_info("H", TensorProto.FLOAT16, ["batch", 2]),
    ],
    [
        helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["batch", 4]),
        helper.make_tensor_value_info("S_OUT", TensorProto.STRING, ["batch"]),
        helper.make_tensor_value_info("H_OUT", TensorProto.FLOAT16, ["batch", 2]),
    ],
    initializer=[numpy_helper.from_array(np.array([1, 2, 3, 4], dtype=np.float32), "Y")],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 9  # as inferd.examples: loadable by older ONNX Runtimes too
onnx.checker.check_model(model, full_check=True)
out = pathlib.Path(__file__).with_suffix(".onnx")
out.write_bytes(model.SerializeToString())
