"""A stateful model's sequence_batching section, checked and read into the core's
``SequenceOptions`` (cpp/include/inferd/sequence_batcher.h) and the control inputs the core writes
into each request: the one place the section is read.

What inferd serves of it: the ``direct`` and ``oldest`` strategies,
``max_sequence_idle_microseconds`` (0: 1 s, as Triton), and ``control_input`` (START, END, READY,
CORRID). Implicit ``state`` and ``iterative_sequence`` are refused at load for now, never
ignored. Beyond Triton, the config parameter ``inferd.sequence_idle_end: "tell"`` has the model
sent one more request of a sequence ended for being idle (END, READY false, no other input).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from inferd._proto.model_config_pb2 import ModelConfig, ModelSequenceBatching
from inferd.core import SequenceOptions
from inferd.datatypes import BY_CONFIG_TYPE, DATATYPES, Datatype
from inferd.errors import ModelLoadError
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


def model_input_names(config: ModelConfig) -> list[str]:
    """Every input the model takes, in order: the config's, then its control inputs."""
    return [tensor.name for tensor in config.input] + [c.name for c in control_inputs(config)]


def sequence_options(config: ModelConfig) -> SequenceOptions | None:
    """The completed config's sequence_batching section as the core's options, checked; None
    without one. The control inputs' indices follow the config's inputs."""
    if not config.HasField("sequence_batching"):
        return None
    name = config.name
    section = config.sequence_batching
    if len(section.state) > 0:
        raise ModelLoadError(
            f"model {name!r}: sequence_batching.state (implicit state) is not supported yet "
            "(refused rather than ignored)"
        )
    if section.iterative_sequence:
        raise ModelLoadError(
            f"model {name!r}: sequence_batching.iterative_sequence is not supported yet "
            "(refused rather than ignored)"
        )
    idle_us = check_range(
        "sequence_batching.max_sequence_idle_microseconds",
        int(section.max_sequence_idle_microseconds),
        0,
        MAX_QUEUE_DELAY_US,
        model=name,
    )
    controls = control_inputs(config)
    common: _CommonOptions = {
        "max_sequence_idle_us": idle_us or DEFAULT_MAX_SEQUENCE_IDLE_US,
        "controls": [
            (c.kind, len(config.input) + k, c.datatype.config_type, c.false_value, c.true_value)
            for k, c in enumerate(controls)
        ],
        "tell_idle_end": _tells_idle_end(config),
        "input_types": [int(t.data_type) for t in config.input]
        + [c.datatype.config_type for c in controls],
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
