"""The fields of config.pbtxt that inferd honours. A config that sets any other field (to a value
other than its default) is refused at load, never silently ignored."""

from __future__ import annotations

from google.protobuf.message import Message

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.errors import ModelLoadError

# What config.pbtxt may set: whole subtrees, and single fields (paths through repeated fields
# name the field once: "input.dims"). Anything else with a value is refused at load, never ignored.
_SUPPORTED_TREES = frozenset(
    {
        "version_policy",
        "dynamic_batching",
        "sequence_batching",  # sequence_config.py refuses what of it is not served yet
        "parameters",
        "model_warmup",
        "input.reshape",
        "output.reshape",
        "optimization.execution_accelerators",
        "optimization.graph",  # ONNX Runtime's graph optimization level (config.py)
        "model_transaction_policy",  # decoupled: python models only (config.py says so)
        "response_cache",  # not for decoupled or stateful models (config.py says so)
    }
)
_SUPPORTED_FIELDS = frozenset(
    {
        "name",
        "platform",
        "backend",
        "max_batch_size",
        "default_model_filename",
        "input.name",
        "input.data_type",
        "input.dims",
        "input.optional",
        "output.name",
        "output.data_type",
        "output.dims",
        "instance_group.name",
        "instance_group.count",
        "instance_group.kind",
        "instance_group.gpus",
    }
)


def _unsupported_paths(message: Message, prefix: str = "") -> list[str]:
    """Paths of the fields set in ``message`` that inferd does not honour (yet)."""
    found: list[str] = []
    for field, value in message.ListFields():
        path = prefix + field.name
        if path in _SUPPORTED_FIELDS or path in _SUPPORTED_TREES:
            continue
        is_message = (
            field.message_type is not None and not field.message_type.GetOptions().map_entry
        )
        has_supported_children = any(
            s.startswith(path + ".") for s in _SUPPORTED_FIELDS | _SUPPORTED_TREES
        )
        if is_message and has_supported_children:
            children = value if field.is_repeated else [value]
            for child in children:
                found += [p for p in _unsupported_paths(child, path + ".") if p not in found]
        elif is_message and not field.is_repeated and not value.ListFields():
            continue  # an empty section, e.g. `optimization { }`: asks for nothing
        else:
            found.append(path)
    return found


def check_honoured(config: ModelConfig) -> None:
    """Refuses a config that sets a field inferd does not honour (yet), naming them all."""
    unsupported = _unsupported_paths(config)
    if unsupported:
        raise ModelLoadError(
            f"model {config.name!r}: config.pbtxt sets {', '.join(unsupported)}, which inferd "
            "does not support yet (refused rather than ignored)"
        )
