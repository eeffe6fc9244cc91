"""A config's sequence_batching section as the core takes it (repository/sequence_config.py):
the options, control inputs and implicit states read, and every shape Triton does not accept
refused at load with a message naming the field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from inferd._proto.model_config_pb2 import DataType, ModelConfig
from inferd.errors import ModelLoadError
from inferd.repository.sequence_config import (
    control_inputs,
    implicit_states,
    iterative_steps,
    model_input_names,
    model_output_names,
    model_output_types,
    sequence_options,
    sequence_state_memory,
)

BASE = """name: "m" backend: "python" max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
START = '{ name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }'
CORRID = '{ name: "ID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }'
READY = (
    '{ name: "READY" control [ { kind: CONTROL_SEQUENCE_READY '
    "bool_false_true: [ false, true ] } ] }"
)


def config(section: str) -> ModelConfig:
    return text_format.Parse(BASE + "sequence_batching { " + section + " }", ModelConfig())


def test_a_section_reads_into_options_and_control_inputs_after_the_models_inputs() -> None:
    parsed = config(f"control_input [ {START}, {CORRID}, {READY} ]")
    options = sequence_options(parsed)
    assert options is not None
    assert not options.oldest
    assert options.max_sequence_idle_us == 1_000_000  # 0 means Triton's 1 s
    assert options.controls == 3
    controls = control_inputs(parsed)
    assert [(c.name, c.kind, c.datatype.name) for c in controls] == [
        ("START", "START", "INT32"),
        ("ID", "CORRID", "BYTES"),
        ("READY", "READY", "BOOL"),
    ]
    assert model_input_names(parsed) == ["INPUT", "START", "ID", "READY"]


def test_oldest_reads_its_candidates() -> None:
    options = sequence_options(
        config("max_sequence_idle_microseconds: 5000 oldest { max_candidate_sequences: 8 }")
    )
    assert options is not None and options.oldest
    assert options.max_sequence_idle_us == 5000


def test_the_idle_end_parameter_is_end_or_tell() -> None:
    told = config("")
    told.parameters["inferd.sequence_idle_end"].string_value = "tell"
    assert sequence_options(told) is not None
    told.parameters["inferd.sequence_idle_end"].string_value = "notify"
    with pytest.raises(
        ModelLoadError, match=r"inferd\.sequence_idle_end is 'notify', not 'end' or 'tell'"
    ):
        sequence_options(told)


def test_a_model_without_the_section_has_no_sequences() -> None:
    plain = text_format.Parse(BASE, ModelConfig())
    assert sequence_options(plain) is None
    assert control_inputs(plain) == []
    assert model_input_names(plain) == ["INPUT"]


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("oldest { max_candidate_sequences: 0 }", "max_candidate_sequences 0 is outside"),
        (
            "oldest { max_candidate_sequences: 2 preferred_batch_size: [ 9 ] }",
            "preferred_batch_size 9 is outside 1..4",
        ),
        ("direct { minimum_slot_utilization: 1.5 }", "minimum_slot_utilization 1.5 is outside"),
        (
            'control_input [ { name: "INPUT" control [ { kind: CONTROL_SEQUENCE_START '
            "int32_false_true: [ 0, 1 ] } ] } ]",
            "needs a name of its own",
        ),
        (
            'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
            "int32_false_true: [ 0, 1 ] }, { kind: CONTROL_SEQUENCE_END "
            "int32_false_true: [ 0, 1 ] } ] } ]",
            "needs exactly one control, has 2",
        ),
        (
            'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ]',
            "needs one of int32_false_true, fp32_false_true or bool_false_true",
        ),
        (
            'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
            "int32_false_true: [ 0, 1, 2 ] } ] } ]",
            "with two values",
        ),
        (
            'control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
            "data_type: TYPE_FP32 } ] } ]",
            "CORRID control's data_type must be",
        ),
        (
            f'control_input [ {START}, {{ name: "S2" control [ {{ kind: CONTROL_SEQUENCE_START '
            "int32_false_true: [ 0, 1 ] } ] } ]",
            "a second START control",
        ),
    ],
)
def test_what_triton_would_not_accept_fails_the_load(section: str, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        sequence_options(config(section))


STATE = 'state [ { input_name: "S" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ -1, 2 ] '


def test_states_read_after_the_controls_and_their_outputs_after_the_configs() -> None:
    parsed = config(f"control_input [ {START} ] {STATE}" + "} ]")
    assert model_input_names(parsed) == ["INPUT", "START", "S"]
    assert model_output_names(parsed) == ["OUTPUT", "S_OUT"]
    assert model_output_types(parsed) == [8, 11]  # TYPE_INT32, then the state's TYPE_FP32
    (state,) = implicit_states(parsed)
    assert (state.dims, state.initial_dims, state.initial) == ((-1, 2), (1, 2), b"")
    with pytest.raises(ModelLoadError, match="needs the server's state memory"):
        sequence_options(parsed)
    options = sequence_options(parsed, None, sequence_state_memory(1 << 20))
    assert options is not None and options.states == 1


def test_a_state_the_config_lists_as_an_output_is_the_clients_too() -> None:
    parsed = config(STATE + "} ]")
    parsed.output.add(name="S_OUT", data_type=DataType.TYPE_FP32, dims=[-1, 2])
    assert model_output_names(parsed) == ["OUTPUT", "S_OUT"]  # once: the config's
    parsed.output[1].dims[:] = [3, 2]
    with pytest.raises(ModelLoadError, match="another data_type or dims"):
        implicit_states(parsed)


def test_an_initial_state_comes_from_zeros_or_a_file_in_initial_state(tmp_path: Path) -> None:
    zero = config(
        STATE + "initial_state { data_type: TYPE_FP32 dims: [ 3, 2 ] zero_data: true } } ]"
    )
    assert implicit_states(zero)[0].initial_dims == (3, 2)
    (tmp_path / "initial_state").mkdir()
    values = np.arange(6, dtype=np.float32)
    (tmp_path / "initial_state" / "start").write_bytes(values.tobytes())
    from_file = config(
        STATE + 'initial_state { data_type: TYPE_FP32 dims: [ 3, 2 ] data_file: "start" } } ]'
    )
    (state,) = implicit_states(from_file, tmp_path)
    assert state.initial == values.tobytes()
    (tmp_path / "initial_state" / "start").write_bytes(values[:5].tobytes())
    with pytest.raises(ModelLoadError, match="has 20 bytes; FP32 \\[3, 2\\] takes 24"):
        implicit_states(from_file, tmp_path)
    (tmp_path / "secret").write_bytes(values.tobytes())
    escaping = config(
        STATE + 'initial_state { data_type: TYPE_FP32 dims: [ 3, 2 ] data_file: "../secret" } } ]'
    )
    with pytest.raises(ModelLoadError, match="must name a file in initial_state/"):
        implicit_states(escaping, tmp_path)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            'state [ { input_name: "INPUT" output_name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "input_name needs a name of its own",
        ),
        (
            'state [ { input_name: "S" output_name: "O" data_type: TYPE_FP32 dims: [ 1 ] },'
            ' { input_name: "T" output_name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "output_name needs a name of its own",
        ),
        (
            'state [ { input_name: "S" output_name: "O" data_type: TYPE_STRING dims: [ 1 ] } ]',
            "data_type must be a fixed-width type",
        ),
        (
            'state [ { input_name: "S" output_name: "O" data_type: TYPE_FP32 dims: [ -2 ] } ]',
            "may hold -1 \\(any\\) but no other negative",
        ),
        (
            STATE + "initial_state { data_type: TYPE_FP32 dims: [ 3, 3 ] zero_data: true } } ]",
            "initial_state needs the state's data_type and fixed dims that fit \\[-1, 2\\]",
        ),
        (
            STATE + "initial_state { data_type: TYPE_INT32 dims: [ 3, 2 ] zero_data: true } } ]",
            "initial_state needs the state's data_type",
        ),
        (
            STATE + "initial_state { data_type: TYPE_FP32 dims: [ 1, 2 ] zero_data: true }"
            " initial_state { data_type: TYPE_FP32 dims: [ 1, 2 ] zero_data: true } } ]",
            "at most one initial_state",
        ),
    ],
)
def test_a_state_triton_would_not_accept_fails_the_load(section: str, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        implicit_states(config(section))


ITERATIVE = """name: "it" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "TOKEN" data_type: TYPE_INT64 dims: [ 1 ] },
        { name: "LENGTH" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "DONE" data_type: TYPE_BOOL dims: [ 1 ] },
         { name: "NEXT" data_type: TYPE_INT64 dims: [ 1 ] } ]
sequence_batching { iterative_sequence: true }
"""


def iterative(**parameters: str) -> ModelConfig:
    parsed = text_format.Parse(ITERATIVE, ModelConfig())
    for key, value in parameters.items():
        parsed.parameters[f"inferd.iterative.{key}"].string_value = value
    return parsed


def test_an_iterative_models_steps_read_by_index() -> None:
    steps = iterative(feedback="NEXT:TOKEN", end_output="DONE", max_steps="64")
    assert iterative_steps(steps) == ([(1, 0)], 0, 64)
    assert iterative_steps(iterative(end_output="DONE")) == ([], 0, 4096)  # Triton-like default
    options = sequence_options(steps)
    assert options is not None and options.iterative
    assert iterative_steps(text_format.Parse(BASE, ModelConfig())) is None


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({}, "say how a generation goes on and ends"),
        ({"feedback": "NEXT"}, "must name one of the config's outputs"),
        ({"feedback": "NEXT:STATE"}, "must name one of the config's outputs"),
        ({"feedback": "DONE:TOKEN"}, "an input of another data_type"),
        ({"end_output": "FINISHED"}, "is not one of the config's outputs"),
        ({"end_output": "DONE", "max_steps": "0"}, "max_steps '0' is not in 1.."),
        ({"end_output": "DONE", "max_steps": "many"}, "max_steps 'many' is not in 1.."),
    ],
)
def test_iterative_parameters_that_do_not_fit_fail_the_load(
    parameters: dict[str, str], message: str
) -> None:
    with pytest.raises(ModelLoadError, match=message):
        iterative_steps(iterative(**parameters))


def test_iterative_parameters_need_an_iterative_model() -> None:
    plain = config("")
    plain.parameters["inferd.iterative.max_steps"].string_value = "4"
    with pytest.raises(ModelLoadError, match=r"needs sequence_batching\.iterative_sequence: true"):
        iterative_steps(plain)


def test_a_python_model_reschedules_itself_and_takes_no_feedback() -> None:
    python = text_format.Parse(
        BASE + "sequence_batching { iterative_sequence: true }", ModelConfig()
    )
    assert iterative_steps(python) == ([], -1, 4096)  # max_steps bounds how often one comes back
    python.parameters["inferd.iterative.end_output"].string_value = "OUTPUT"
    with pytest.raises(ModelLoadError, match="a python model reschedules its requests itself"):
        iterative_steps(python)
