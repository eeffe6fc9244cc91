"""The model repository on disk: layout, versions and each model's configuration."""

from inferd.repository.batching_config import batcher_options
from inferd.repository.config import (
    ModelConfig,
    load_model_config,
    model_filename,
    parse_config_json,
    readiness_required,
    stated_config,
    stated_readiness_required,
)
from inferd.repository.instances import (
    GpuAccelerator,
    InstancePlacement,
    gpu_accelerator,
    instance_placements,
)
from inferd.repository.layout import ModelRepository
from inferd.repository.sequence_config import (
    ControlInput,
    ImplicitState,
    control_inputs,
    implicit_states,
    model_input_names,
    model_output_names,
    model_output_types,
    sequence_options,
    sequence_state_memory,
)

__all__ = [
    "ControlInput",
    "GpuAccelerator",
    "ImplicitState",
    "InstancePlacement",
    "ModelConfig",
    "ModelRepository",
    "batcher_options",
    "control_inputs",
    "gpu_accelerator",
    "implicit_states",
    "instance_placements",
    "load_model_config",
    "model_filename",
    "model_input_names",
    "model_output_names",
    "model_output_types",
    "parse_config_json",
    "readiness_required",
    "sequence_options",
    "sequence_state_memory",
    "stated_config",
    "stated_readiness_required",
]
