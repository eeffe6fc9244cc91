"""A config's batching and padding policy: its dynamic_batching section (sequence_batching's
max_batch_size and preserve_ordering: sequence_config.py reads the rest), and inferd's padding
parameters (variable-length inputs padded to the longest of their batch), checked and read into
the core's ``BatcherOptions``: the one place the config's batching settings are read."""

from __future__ import annotations

import inferd._proto.model_config_pb2 as model_config_pb2
from inferd._proto.model_config_pb2 import ModelConfig
from inferd.core import BatcherOptions, Padding, QueuePolicy
from inferd.datatypes import BY_CONFIG_TYPE
from inferd.errors import ModelLoadError
from inferd.repository.ranges import MAX_PRIORITY_LEVELS, MAX_QUEUE_DELAY_US, check_range


def batcher_options(config: ModelConfig) -> BatcherOptions:
    """The completed config's dynamic_batching section and padding parameters as the core's
    options, checked."""
    name = config.name
    if config.WhichOneof("scheduling_choice") not in (
        None,
        "dynamic_batching",
        "sequence_batching",
    ):
        raise ModelLoadError(
            f"model {name!r}: {config.WhichOneof('scheduling_choice')} is not supported"
        )
    if config.HasField("sequence_batching"):
        # Its requests queue by sequence (sequence_config.py); only these two are read here.
        if any(key in config.parameters for key in PADDING_KEYS):
            raise ModelLoadError(f"model {name!r}: padding parameters need dynamic_batching")
        oldest = config.sequence_batching.oldest
        return BatcherOptions(
            dynamic=False,
            max_batch_size=int(config.max_batch_size),
            preserve_ordering=bool(oldest.preserve_ordering),
        )
    if not config.HasField("dynamic_batching"):
        if any(key in config.parameters for key in PADDING_KEYS):
            raise ModelLoadError(f"model {name!r}: padding parameters need dynamic_batching")
        return BatcherOptions(dynamic=False, max_batch_size=int(config.max_batch_size))
    section = config.dynamic_batching
    max_batch_size = int(config.max_batch_size)
    if max_batch_size == 0:
        raise ModelLoadError(
            f"model {name!r}: dynamic_batching needs max_batch_size > 0 (the model does not batch)"
        )
    for size in section.preferred_batch_size:
        check_range(
            "dynamic_batching.preferred_batch_size",
            size,
            1,
            max_batch_size,
            model=name,
            reason="max_batch_size",
        )
    levels, default_level = _priority_levels(section, name)
    max_queue_delay_us = check_range(
        "dynamic_batching.max_queue_delay_microseconds",
        int(section.max_queue_delay_microseconds),
        0,
        MAX_QUEUE_DELAY_US,
        model=name,
    )

    def queue_policy(policy: model_config_pb2.ModelQueuePolicy) -> QueuePolicy:
        return QueuePolicy(
            delay_on_timeout=policy.timeout_action == model_config_pb2.ModelQueuePolicy.DELAY,
            default_timeout_us=int(policy.default_timeout_microseconds),
            allow_timeout_override=bool(policy.allow_timeout_override),
            max_queue_size=int(policy.max_queue_size),
        )

    return BatcherOptions(
        padding=_padding(config),
        dynamic=True,
        max_batch_size=max_batch_size,
        preferred_batch_sizes=[int(s) for s in section.preferred_batch_size],
        max_queue_delay_us=max_queue_delay_us,
        priority_levels=levels,
        default_priority_level=default_level,
        default_queue_policy=queue_policy(section.default_queue_policy),
        level_queue_policies={
            int(level): queue_policy(p) for level, p in section.priority_queue_policy.items()
        },
        preserve_ordering=bool(section.preserve_ordering),
    )


def _priority_levels(section: model_config_pb2.ModelDynamicBatching, name: str) -> tuple[int, int]:
    """The section's priority_levels and default_priority_level, checked."""
    levels = check_range(
        "dynamic_batching.priority_levels",
        int(section.priority_levels),
        0,
        MAX_PRIORITY_LEVELS,
        model=name,
    )
    for level in section.priority_queue_policy:
        if not 1 <= level <= levels:
            raise ModelLoadError(
                f"model {name!r}: dynamic_batching.priority_queue_policy names level {level}, "
                f"outside 1..{levels} (priority_levels)"
            )
    if not levels:
        return 0, 0  # Triton ignores the default level then: it does not reach the core
    default_level = check_range(
        "dynamic_batching.default_priority_level",
        int(section.default_priority_level),
        1,
        levels,
        model=name,
        reason="priority_levels",
    )
    return levels, default_level


# Config parameters that turn on padding of variable-length inputs (inferd's, beyond Triton):
PAD_INPUTS = "inferd.pad_inputs"  # comma-separated inputs padded to the longest in their batch
PAD_VALUE = "inferd.pad_value"  # the number written into the padding (default 0)
PAD_OUTPUTS = "inferd.pad_outputs"  # outputs sliced back to each request's own lengths
PADDING_KEYS = (PAD_INPUTS, PAD_VALUE, PAD_OUTPUTS)


def _names(config: ModelConfig, key: str) -> list[str]:
    value = config.parameters[key].string_value if key in config.parameters else ""
    return [n.strip() for n in value.split(",") if n.strip()]


def _padding(config: ModelConfig) -> Padding:
    """The padding the config's parameters ask for; the first padded input is the reference
    whose lengths the padded outputs' variable dims follow, in order."""
    name = config.name
    pad_inputs = _names(config, PAD_INPUTS)
    if not pad_inputs:
        if any(key in config.parameters for key in (PAD_VALUE, PAD_OUTPUTS)):
            raise ModelLoadError(f"model {name!r}: {PAD_VALUE}/{PAD_OUTPUTS} need {PAD_INPUTS}")
        return Padding()
    inputs = {t.name: (i, t) for i, t in enumerate(config.input)}
    outputs = {t.name: (i, t) for i, t in enumerate(config.output)}
    try:
        value = (
            float(config.parameters[PAD_VALUE].string_value or 0)
            if PAD_VALUE in config.parameters
            else 0.0
        )
    except ValueError:
        raise ModelLoadError(f"model {name!r}: {PAD_VALUE} must be a number") from None
    flags = [False] * len(config.input)
    for input_name in pad_inputs:
        if input_name not in inputs:
            raise ModelLoadError(f"model {name!r}: {PAD_INPUTS} names {input_name!r}, not an input")
        index, tensor = inputs[input_name]
        datatype = BY_CONFIG_TYPE[tensor.data_type]
        if datatype.is_bytes:
            raise ModelLoadError(f"model {name!r}: BYTES input {input_name!r} cannot be padded")
        if datatype.name in ("FP16", "BF16") and value != 0:
            raise ModelLoadError(f"model {name!r}: {datatype.name} inputs pad with 0 only")
        if -1 not in tensor.dims:
            raise ModelLoadError(
                f"model {name!r}: {PAD_INPUTS} names {input_name!r}, which has no variable dim"
            )
        flags[index] = True
    reference_index, reference = inputs[pad_inputs[0]]
    reference_dims = [d + 1 for d, size in enumerate(reference.dims) if size == -1]
    slices: list[tuple[tuple[int, int], ...]] = [() for _ in config.output]
    for output_name in _names(config, PAD_OUTPUTS):
        if output_name not in outputs:
            raise ModelLoadError(
                f"model {name!r}: {PAD_OUTPUTS} names {output_name!r}, not an output"
            )
        index, output = outputs[output_name]
        variable = [d + 1 for d, size in enumerate(output.dims) if size == -1]
        if not variable or len(variable) > len(reference_dims):
            raise ModelLoadError(
                f"model {name!r}: output {output_name!r} has {len(variable)} variable dims "
                f"to slice, input {pad_inputs[0]!r} has {len(reference_dims)}"
            )
        slices[index] = tuple(zip(variable, reference_dims, strict=False))
    return Padding(inputs=flags, value=value, reference_input=reference_index, outputs=slices)
