"""ONNX Runtime's messages reach clients without where in ORT's source a check failed (issue 13,
item 2): the Python API's executor and the core's native executor both leave the location and
the C++ function out and log the full text."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from structlog.testing import capture_logs

from inferd.datatypes import DATATYPES
from inferd.errors import Internal
from inferd.examples import IR_VERSION, OPSET
from inferd.executors import OnnxRuntimeExecutor, OnnxRuntimeOptions
from inferd.executors.onnxruntime_native import NativeOnnxRuntimeExecutor, native_onnxruntime
from inferd.executors.runtime_messages import without_source_locations

OPTIONS = OnnxRuntimeOptions(intra_op_thread_count=1, inter_op_thread_count=1)

# ORT's own text for a Reshape it cannot do (the C++ test checks the core's copy on the same).
RESHAPE_FAILURE = (
    "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node. "
    "Name:'' Status Message: /onnxruntime_src/onnxruntime/core/providers/cpu/tensor/"
    "reshape_helper.h:91 onnxruntime::ReshapeHelper::ReshapeHelper("
    "const onnxruntime::TensorShape&, "
    "onnxruntime::TensorShapeVector&, bool) input_shape_size == requested_shape_size was false. "
    "The input tensor cannot be reshaped to the requested shape. Input shape:{3}, requested "
    "shape:{2}\n"
)


def test_source_locations_and_their_functions_are_left_out() -> None:
    assert without_source_locations(RESHAPE_FAILURE) == (
        "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node. "
        "Name:'' Status Message: input_shape_size == requested_shape_size was false. "
        "The input tensor cannot be reshaped to the requested shape. Input shape:{3}, requested "
        "shape:{2}"
    )
    assert (
        without_source_locations(
            "C:\\ort\\x.cc:12 failed; a.cc:3 too; ratio 1.5:2 and /models/m:1 stay"
        )
        == "failed; too; ratio 1.5:2 and /models/m:1 stay"
    )


def reshape_model(tmp_path: Path) -> Path:
    """X FP32 [n] reshaped to the shape S INT64 [1] says: fails inside ORT when they disagree."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["X", "S"], ["Y"])],
        "reshape",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("S", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["m"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    path = tmp_path / "reshape.onnx"
    onnx.save(model, path)
    return path


def failing_inputs() -> list[np.ndarray | None]:
    return [np.zeros(3, dtype=np.float32), np.array([2], dtype=np.int64)]


def test_the_python_api_executor_answers_without_source_locations(tmp_path: Path) -> None:
    executor = OnnxRuntimeExecutor(reshape_model(tmp_path), ["X", "S"], ["Y"], OPTIONS)
    with capture_logs() as logs, pytest.raises(Internal) as failure:
        executor.execute(failing_inputs())
    executor.close()
    message = str(failure.value)
    assert "cannot be reshaped" in message
    assert "onnxruntime_src" not in message and "ReshapeHelper" not in message, message
    [logged] = [r for r in logs if r["event"] == "ONNX Runtime failed a run"]
    assert "onnxruntime_src" in str(logged["reason"])  # the full text stays in the server log


@pytest.mark.skipif(
    native_onnxruntime().version is None, reason="ONNX Runtime's library cannot be loaded"
)
def test_the_native_executor_answers_without_source_locations(tmp_path: Path) -> None:
    executor = NativeOnnxRuntimeExecutor(
        reshape_model(tmp_path), ["X", "S"], ["Y"], OPTIONS, [DATATYPES["FP32"].config_type]
    )
    with pytest.raises(Internal) as failure:
        executor.execute(failing_inputs())
    executor.close()
    message = str(failure.value)
    assert "cannot be reshaped" in message
    assert "onnxruntime_src" not in message and "ReshapeHelper" not in message, message
