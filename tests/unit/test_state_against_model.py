"""An implicit state against what serves it: its input and output must be the ONNX model's, of
the state's type and a shape its dims allow, and left out of a completed config's tensors
(repository/autocomplete.py); only ONNX Runtime keeps state (executors/selection.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.datatypes import DATATYPES
from inferd.errors import ModelLoadError
from inferd.executors.onnxruntime import OnnxRuntimeOptions
from inferd.executors.selection import create_executors
from inferd.repository.autocomplete import ModelTensor, check_against_model, complete_config

INT32, FP32 = DATATYPES["INT32"], DATATYPES["FP32"]
STATEFUL = """name: "m" platform: "onnxruntime_onnx" max_batch_size: 4
sequence_batching { state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32
                              dims: [ -1 ] } ] }
"""
MODEL_INPUTS = [ModelTensor("INPUT", INT32, (-1, 1)), ModelTensor("S_IN", FP32, (-1, -1))]
MODEL_OUTPUTS = [ModelTensor("OUTPUT", INT32, (-1, 1)), ModelTensor("S_OUT", FP32, (-1, -1))]


def test_a_completed_config_leaves_the_states_tensors_to_the_core() -> None:
    config = text_format.Parse(STATEFUL, ModelConfig())
    complete_config(config, MODEL_INPUTS, MODEL_OUTPUTS, default_max_batch_size=4)
    assert [t.name for t in config.input] == ["INPUT"]
    assert [t.name for t in config.output] == ["OUTPUT"]
    check_against_model(config, MODEL_INPUTS, MODEL_OUTPUTS)


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        (MODEL_INPUTS[:1], MODEL_OUTPUTS, "state input 'S_IN': the ONNX model has no such input"),
        (MODEL_INPUTS, MODEL_OUTPUTS[:1], "state output 'S_OUT': the ONNX model has no such"),
        (
            [MODEL_INPUTS[0], ModelTensor("S_IN", INT32, (-1, -1))],
            MODEL_OUTPUTS,
            "the state is TYPE_FP32, the ONNX model says TYPE_INT32",
        ),
        (
            MODEL_INPUTS,
            [MODEL_OUTPUTS[0], ModelTensor("S_OUT", FP32, (-1, 4, 4))],
            "the state's shape is \\[-1, -1\\], the ONNX model has \\[-1, 4, 4\\]",
        ),
    ],
)
def test_a_state_the_onnx_model_does_not_have_fails_the_load(
    inputs: list[ModelTensor], outputs: list[ModelTensor], message: str
) -> None:
    config = text_format.Parse(STATEFUL, ModelConfig())
    config.input.add(name="INPUT", data_type=INT32.config_type, dims=[1])
    config.output.add(name="OUTPUT", data_type=INT32.config_type, dims=[1])
    with pytest.raises(ModelLoadError, match=message):
        check_against_model(config, inputs, outputs)


@pytest.mark.parametrize(
    "serving",
    [
        'backend: "python"',
        'parameters { key: "inferd.executor" value: { string_value: "tensorrt" } }',
    ],
)
def test_state_is_refused_where_onnx_runtime_does_not_serve_the_model(serving: str) -> None:
    config = text_format.Parse(
        STATEFUL.replace('platform: "onnxruntime_onnx"', serving), ModelConfig()
    )
    with pytest.raises(ModelLoadError, match=r"implicit state .* is kept for ONNX models"):
        # Refused before anything is built: no placement, pool or file is touched.
        create_executors(
            config, Path("unused"), [], None, OnnxRuntimeOptions(1, 1), None, Path("unused")
        )


def test_iterative_sequences_are_refused_for_tensorrt() -> None:
    for serving in ('platform: "tensorrt_plan"',):
        config = text_format.Parse(
            f'name: "m" {serving} max_batch_size: 4 '
            "sequence_batching { iterative_sequence: true }",
            ModelConfig(),
        )
        with pytest.raises(ModelLoadError, match="iterative_sequence is served for ONNX models"):
            create_executors(
                config, Path("unused"), [], None, OnnxRuntimeOptions(1, 1), None, Path("unused")
            )
