"""A stateful model's sequence_batching section, checked and read into the core's
``SequenceOptions`` (cpp/include/inferd/sequence_batcher.h) and the control inputs the core writes
into each request: the one place the section is read.

What inferd serves of it: the ``direct`` and ``oldest`` strategies,
``max_sequence_idle_microseconds`` (0: 1 s, as Triton), ``control_input`` (START, END, READY,
CORRID), implicit ``state`` and ``iterative_sequence`` (ONNX models). Beyond Triton, the config
parameter ``inferd.sequence_idle_end: "tell"`` has the model sent one more request of a sequence
ended for being idle (END, READY false, no other input), and an iterative ONNX model says how a
step leads to the next with ``inferd.iterative.feedback`` ("OUTPUT:INPUT" pairs, comma-separated:
the output's value is the input's at the next step), ``inferd.iterative.end_output`` (an output
whose first element, not zero, ends the generation) and ``inferd.iterative.max_steps``.

The executor's inputs are the config's, then the control inputs, then the states' inputs; its
outputs the config's, then each state's output that the config does not list (the client never
sees those).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from inferd._proto.model_config_pb2 import ModelConfig, ModelSequenceBatching
from inferd.core import SequenceOptions, SequenceStateMemory
from inferd.datatypes import BY_CONFIG_TYPE, DATATYPES, Datatype
from inferd.errors import ModelLoadError
from inferd.repository.config import PYTHON_BACKEND
from inferd.repository.ranges import MAX_QUEUE_DELAY_US, check_range

_Control = ModelSequenceBatching.Control
_KINDS = {
    _Control.CONTROL_SEQUENCE_START: "START",
    _Control.CONTROL_SEQUENCE_END: "END",
    _Control.CONTROL_SEQUENCE_READY: "READY",
    _Control.CONTROL_SEQUENCE_CORRID: "CORRID",
}
# A sequence idle this long is ended when the config says 0 (Triton's default).
DEFAULT_MAX_SEQUENCE_IDLE_US = 1_000_000
# The config parameter saying what a sequence's idle end does: "end" (Triton's, silent) or
# "tell" (the model gets one more request of the sequence).
IDLE_END_PARAMETER = "inferd.sequence_idle_end"
_CORRID_TYPES = ("UINT64", "INT64", "UINT32", "INT32", "BYTES")
# Where a state's initial_state.data_file lives, in the model's folder (Triton's).
INITIAL_STATE_FOLDER = "initial_state"
# An iterative model's parameters (see above), and the most steps one runs when unsaid.
FEEDBACK_PARAMETER = "inferd.iterative.feedback"
END_OUTPUT_PARAMETER = "inferd.iterative.end_output"
MAX_STEPS_PARAMETER = "inferd.iterative.max_steps"
DEFAULT_MAX_STEPS = 4096
# The server flag that bounds the bytes every sequence's implicit state holds, and its default.
STATE_MEMORY_FLAG = "--max-sequence-state-bytes"
DEFAULT_MAX_SEQUENCE_STATE_BYTES = 1 << 30


def sequence_state_memory(
    limit_bytes: int = DEFAULT_MAX_SEQUENCE_STATE_BYTES,
) -> SequenceStateMemory:
    """The bound every stateful model's sequences share: their state's bytes, across models."""
    return SequenceStateMemory(limit_bytes, STATE_MEMORY_FLAG)


@dataclass(frozen=True)
class ControlInput:
    """A control input the core writes into each request of a sequence: one element (dims [1])."""

    name: str
    kind: str  # START, END, READY or CORRID
    datatype: Datatype
    false_value: float = 0.0
    true_value: float = 1.0

    @property
    def dims(self) -> tuple[int, ...]:
        return (1,)

    # As the core's signature takes an input: never reshaped, never the client's to leave out.
    @property
    def reshape(self) -> tuple[int, ...] | None:
        return None

    @property
    def optional(self) -> bool:
        return False


def control_inputs(config: ModelConfig) -> list[ControlInput]:
    """The config's control inputs, in the order it lists them (after its inputs, in the model's
    input order); none without sequence_batching. Raises ModelLoadError for one that is not
    Triton's shape."""
    if not config.HasField("sequence_batching"):
        return []
    name = config.name
    declared = {tensor.name for tensor in config.input}
    seen_names: set[str] = set()
    seen_kinds: set[str] = set()
    controls: list[ControlInput] = []
    for entry in config.sequence_batching.control_input:
        where = f"model {name!r}: sequence_batching.control_input {entry.name!r}"
        if not entry.name or entry.name in declared or entry.name in seen_names:
            raise ModelLoadError(f"{where}: needs a name of its own, not one of the model's inputs")
        seen_names.add(entry.name)
        if len(entry.control) != 1:
            raise ModelLoadError(f"{where}: needs exactly one control, has {len(entry.control)}")
        control = entry.control[0]
        kind = _KINDS[control.kind]
        if kind in seen_kinds:
            raise ModelLoadError(f"{where}: a second {kind} control")
        seen_kinds.add(kind)
        controls.append(_control_input(entry.name, kind, control, where))
    return controls


def _control_input(
    name: str, kind: str, control: ModelSequenceBatching.Control, where: str
) -> ControlInput:
    if kind == "CORRID":
        datatype = BY_CONFIG_TYPE.get(int(control.data_type))
        if datatype is None or datatype.name not in _CORRID_TYPES:
            raise ModelLoadError(
                f"{where}: a CORRID control's data_type must be TYPE_UINT64, TYPE_INT64, "
                "TYPE_UINT32, TYPE_INT32 or TYPE_STRING"
            )
        return ControlInput(name, kind, datatype)
    given = [
        (field, list(getattr(control, field)))
        for field in ("int32_false_true", "fp32_false_true", "bool_false_true")
        if len(getattr(control, field)) > 0
    ]
    if len(given) != 1 or len(given[0][1]) != 2:
        raise ModelLoadError(
            f"{where}: a {kind} control needs one of int32_false_true, fp32_false_true or "
            "bool_false_true, with two values (false, true)"
        )
    field, (false_value, true_value) = given[0]
    type_name = {"int32_false_true": "INT32", "fp32_false_true": "FP32"}.get(field, "BOOL")
    datatype = DATATYPES[type_name]
    return ControlInput(name, kind, datatype, float(false_value), float(true_value))


@dataclass(frozen=True)
class ImplicitState:
    """An implicit state (sequence_batching.state): an input the core feeds each request of a
    sequence (``name``) and the output it keeps from it for the next (``output_name``).
    ``initial_dims`` and ``initial`` (bytes, row-major; b"" for zeros) are a new sequence's."""

    name: str
    output_name: str
    datatype: Datatype
    dims: tuple[int, ...]
    initial_dims: tuple[int, ...]
    initial: bytes = b""

    # As the core's signature takes an input: written by the core, never the client's.
    @property
    def reshape(self) -> tuple[int, ...] | None:
        return None

    @property
    def optional(self) -> bool:
        return False


def implicit_states(config: ModelConfig, model_dir: Path | None = None) -> list[ImplicitState]:
    """The config's implicit states, checked, in its order; none without sequence_batching.
    ``model_dir``: where an initial_state.data_file is read from (its initial_state/ folder);
    None reads none (the states' shapes only). Raises ModelLoadError."""
    if not config.HasField("sequence_batching"):
        return []
    taken = {tensor.name for tensor in config.input} | {c.name for c in control_inputs(config)}
    outputs = {tensor.name: tensor for tensor in config.output}
    seen_outputs: set[str] = set()
    states: list[ImplicitState] = []
    for entry in config.sequence_batching.state:
        where = f"model {config.name!r}: sequence_batching.state {entry.input_name!r}"
        if not entry.input_name or entry.input_name in taken:
            raise ModelLoadError(
                f"{where}: input_name needs a name of its own, not one of the model's inputs or "
                "control inputs"
            )
        taken.add(entry.input_name)
        if not entry.output_name or entry.output_name in seen_outputs:
            raise ModelLoadError(f"{where}: output_name needs a name of its own")
        seen_outputs.add(entry.output_name)
        datatype = BY_CONFIG_TYPE.get(int(entry.data_type))
        if datatype is None or datatype.is_bytes:
            raise ModelLoadError(f"{where}: data_type must be a fixed-width type, not TYPE_STRING")
        dims = tuple(int(d) for d in entry.dims)
        if any(d < -1 for d in dims):
            raise ModelLoadError(
                f"{where}: dims {list(dims)} may hold -1 (any) but no other negative"
            )
        listed = outputs.get(entry.output_name)
        if listed is not None and (
            int(listed.data_type) != int(entry.data_type) or tuple(listed.dims) != dims
        ):
            raise ModelLoadError(
                f"{where}: its output {entry.output_name!r} is in the config's outputs with "
                "another data_type or dims than the state's"
            )
        initial_dims, initial = _initial_state(entry, datatype, dims, model_dir, where)
        states.append(
            ImplicitState(
                entry.input_name, entry.output_name, datatype, dims, initial_dims, initial
            )
        )
    return states


def _initial_state(
    entry: ModelSequenceBatching.State,
    datatype: Datatype,
    dims: tuple[int, ...],
    model_dir: Path | None,
    where: str,
) -> tuple[tuple[int, ...], bytes]:
    """A new sequence's state: Triton's, dims with 1 for each -1 and (where Triton leaves it
    uninitialized) zeros, unless initial_state says otherwise."""
    if len(entry.initial_state) == 0:
        return tuple(1 if d == -1 else d for d in dims), b""
    if len(entry.initial_state) > 1:
        raise ModelLoadError(f"{where}: at most one initial_state")
    initial = entry.initial_state[0]
    initial_dims = tuple(int(d) for d in initial.dims)
    fits = len(initial_dims) == len(dims) and all(
        i >= 0 and (d == -1 or d == i) for i, d in zip(initial_dims, dims, strict=True)
    )
    if int(initial.data_type) != int(entry.data_type) or not fits:
        raise ModelLoadError(
            f"{where}: initial_state needs the state's data_type and fixed dims that fit "
            f"{list(dims)}, has {list(initial_dims)}"
        )
    if initial.WhichOneof("state_data") != "data_file":
        return initial_dims, b""  # zero_data
    size = math.prod(initial_dims) * datatype.itemsize
    if model_dir is None:
        return initial_dims, bytes(size)
    folder = (model_dir / INITIAL_STATE_FOLDER).resolve()
    path = (folder / initial.data_file).resolve()
    if not initial.data_file or not path.is_relative_to(folder) or not path.is_file():
        raise ModelLoadError(
            f"{where}: initial_state.data_file must name a file in {INITIAL_STATE_FOLDER}/"
        )
    if path.stat().st_size != size:
        raise ModelLoadError(
            f"{where}: initial_state.data_file has {path.stat().st_size} bytes; "
            f"{datatype.name} {list(initial_dims)} takes {size}"
        )
    return initial_dims, path.read_bytes()


def model_input_names(config: ModelConfig) -> list[str]:
    """Every input the model takes, in order: the config's, its control inputs, its states'."""
    return (
        [tensor.name for tensor in config.input]
        + [c.name for c in control_inputs(config)]
        + [state.name for state in implicit_states(config)]
    )


def model_output_names(config: ModelConfig) -> list[str]:
    """Every output the model's executor gives, in order: the config's, then the states'
    outputs the config does not list."""
    listed = [tensor.name for tensor in config.output]
    hidden = [s.output_name for s in implicit_states(config) if s.output_name not in listed]
    return listed + hidden


def model_output_types(config: ModelConfig) -> list[int]:
    """The datatype codes of ``model_output_names``, in its order."""
    listed = {tensor.name for tensor in config.output}
    hidden = [s for s in implicit_states(config) if s.output_name not in listed]
    return [int(t.data_type) for t in config.output] + [s.datatype.config_type for s in hidden]


def sequence_options(
    config: ModelConfig,
    model_dir: Path | None = None,
    state_memory: SequenceStateMemory | None = None,
) -> SequenceOptions | None:
    """The completed config's sequence_batching section as the core's options, checked; None
    without one. The control inputs' indices follow the config's inputs, the states' inputs
    the control inputs. ``model_dir``: where initial states are read from; ``state_memory``:
    the bound every sequence's state shares (required with implicit state)."""
    if not config.HasField("sequence_batching"):
        return None
    name = config.name
    section = config.sequence_batching
    idle_us = check_range(
        "sequence_batching.max_sequence_idle_microseconds",
        int(section.max_sequence_idle_microseconds),
        0,
        MAX_QUEUE_DELAY_US,
        model=name,
    )
    controls = control_inputs(config)
    states = implicit_states(config, model_dir)
    if states and state_memory is None:
        raise ModelLoadError(f"model {name!r}: implicit state needs the server's state memory")
    outputs = model_output_names(config)
    first_state = len(config.input) + len(controls)
    common: _CommonOptions = {
        "max_sequence_idle_us": idle_us or DEFAULT_MAX_SEQUENCE_IDLE_US,
        "controls": [
            (c.kind, len(config.input) + k, c.datatype.config_type, c.false_value, c.true_value)
            for k, c in enumerate(controls)
        ],
        "tell_idle_end": _tells_idle_end(config),
        "input_types": [int(t.data_type) for t in config.input]
        + [c.datatype.config_type for c in controls]
        + [state.datatype.config_type for state in states],
        "states": [
            (
                state.name,
                first_state + k,
                outputs.index(state.output_name),
                state.datatype.config_type,
                list(state.dims),
                list(state.initial_dims),
                state.initial,
            )
            for k, state in enumerate(states)
        ],
        "visible_outputs": len(config.output),
        "state_memory": state_memory,
        "iterative": iterative_steps(config),
    }
    if section.WhichOneof("strategy_choice") == "oldest":
        return _oldest(config, section.oldest, common)
    direct = section.direct
    utilization = float(direct.minimum_slot_utilization)
    if not 0.0 <= utilization <= 1.0:
        raise ModelLoadError(
            f"model {name!r}: sequence_batching.direct.minimum_slot_utilization {utilization:g} "
            "is outside 0..1"
        )
    return SequenceOptions(
        strategy="direct",
        max_queue_delay_us=_delay("direct", int(direct.max_queue_delay_microseconds), name),
        minimum_slot_utilization=utilization,
        **common,
    )


class _CommonOptions(TypedDict):
    """What both strategies' options hold."""

    max_sequence_idle_us: int
    controls: list[tuple[str, int, int, float, float]]
    tell_idle_end: bool
    input_types: list[int]
    states: list[tuple[str, int, int, int, list[int], list[int], bytes]]
    visible_outputs: int
    state_memory: SequenceStateMemory | None
    iterative: tuple[list[tuple[int, int]], int, int] | None


def iterative_steps(config: ModelConfig) -> tuple[list[tuple[int, int]], int, int] | None:
    """An iterative model's steps as the core takes them: (feedback as (output index, input
    index) pairs, the end output's index or -1, max steps); None for a model whose requests name
    their sequences. Every name is the config's own: an output it lists, an input it lists of the
    output's datatype."""
    if not config.sequence_batching.iterative_sequence:
        for key in (FEEDBACK_PARAMETER, END_OUTPUT_PARAMETER, MAX_STEPS_PARAMETER):
            if key in config.parameters:
                raise ModelLoadError(
                    f"model {config.name!r}: parameter {key} needs "
                    "sequence_batching.iterative_sequence: true"
                )
        return None
    where = f"model {config.name!r}: iterative_sequence"
    outputs = {t.name: (k, int(t.data_type)) for k, t in enumerate(config.output)}
    inputs = {t.name: (k, int(t.data_type)) for k, t in enumerate(config.input)}

    def parameter(key: str) -> str:
        return config.parameters[key].string_value.strip() if key in config.parameters else ""

    feedback: list[tuple[int, int]] = []
    for pair in filter(None, (p.strip() for p in parameter(FEEDBACK_PARAMETER).split(","))):
        output, _, input_name = (part.strip() for part in pair.partition(":"))
        if output not in outputs or input_name not in inputs:
            raise ModelLoadError(
                f"{where}: {FEEDBACK_PARAMETER} {pair!r} must name one of the config's outputs "
                f"{sorted(outputs)} and one of its inputs {sorted(inputs)}, as OUTPUT:INPUT"
            )
        if outputs[output][1] != inputs[input_name][1]:
            raise ModelLoadError(
                f"{where}: {FEEDBACK_PARAMETER} {pair!r} feeds an output into an input of "
                "another data_type"
            )
        feedback.append((outputs[output][0], inputs[input_name][0]))
    end = parameter(END_OUTPUT_PARAMETER)
    if end and end not in outputs:
        raise ModelLoadError(
            f"{where}: {END_OUTPUT_PARAMETER} {end!r} is not one of the config's outputs "
            f"{sorted(outputs)}"
        )
    steps = parameter(MAX_STEPS_PARAMETER) or str(DEFAULT_MAX_STEPS)
    if not steps.isdigit() or not 1 <= int(steps) <= 1 << 24:
        raise ModelLoadError(f"{where}: {MAX_STEPS_PARAMETER} {steps!r} is not in 1..{1 << 24}")
    if config.backend == PYTHON_BACKEND:
        # Model code decides: request.set_release_flags(RESCHEDULE) takes a request on.
        if feedback or end:
            raise ModelLoadError(
                f"{where}: a python model reschedules its requests itself "
                f"(set_release_flags): {FEEDBACK_PARAMETER} and {END_OUTPUT_PARAMETER} are for "
                "ONNX models"
            )
        return [], -1, int(steps)
    if not end and not feedback and not parameter(MAX_STEPS_PARAMETER):
        raise ModelLoadError(
            f"{where}: say how a generation goes on and ends: {FEEDBACK_PARAMETER}, "
            f"{END_OUTPUT_PARAMETER}, {MAX_STEPS_PARAMETER}"
        )
    return feedback, outputs[end][0] if end else -1, int(steps)


def _tells_idle_end(config: ModelConfig) -> bool:
    """The config parameter inferd.sequence_idle_end: "end" (the default) or "tell"."""
    if IDLE_END_PARAMETER not in config.parameters:
        return False
    value = config.parameters[IDLE_END_PARAMETER].string_value
    if value not in ("end", "tell"):
        raise ModelLoadError(
            f"model {config.name!r}: parameter {IDLE_END_PARAMETER} is {value!r}, "
            "not 'end' or 'tell'"
        )
    return value == "tell"


def _oldest(
    config: ModelConfig, oldest: ModelSequenceBatching.StrategyOldest, common: _CommonOptions
) -> SequenceOptions:
    name = config.name
    candidates = check_range(
        "sequence_batching.oldest.max_candidate_sequences",
        int(oldest.max_candidate_sequences),
        1,
        1 << 20,
        model=name,
    )
    most = max(int(config.max_batch_size), 1)
    for size in oldest.preferred_batch_size:
        check_range(
            "sequence_batching.oldest.preferred_batch_size",
            int(size),
            1,
            most,
            model=name,
            reason="max_batch_size",
        )
    return SequenceOptions(
        strategy="oldest",
        max_queue_delay_us=_delay("oldest", int(oldest.max_queue_delay_microseconds), name),
        max_candidate_sequences=candidates,
        preferred_batch_sizes=[int(size) for size in oldest.preferred_batch_size],
        **common,
    )


def _delay(strategy: str, value: int, name: str) -> int:
    return check_range(
        f"sequence_batching.{strategy}.max_queue_delay_microseconds",
        value,
        0,
        MAX_QUEUE_DELAY_US,
        model=name,
    )
