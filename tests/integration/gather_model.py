"""A model that fails inside ONNX Runtime for some inputs: OUTPUT0 = TABLE[INPUT0], an index outside
0..3 an error of the runtime's own (for the failure paths: its log records, batch isolation)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from inferd.examples import IR_VERSION, OPSET

TABLE = [10.0, 20.0, 30.0, 40.0]


def write_gather_model(model_dir: Path, config: str) -> None:
    """INPUT0 INT64 [batch, 1] -> OUTPUT0 FP32 [batch, 1], with `config` as its config.pbtxt."""
    (model_dir / "1").mkdir(parents=True)
    table = numpy_helper.from_array(np.array(TABLE, np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "INPUT0"], ["OUTPUT0"], axis=0)],
        "gather",
        [helper.make_tensor_value_info("INPUT0", TensorProto.INT64, ["batch", 1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 1])],
        initializer=[table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.save(model, model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(config)
