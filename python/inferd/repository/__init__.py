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
    control_inputs,
    model_input_names,
    sequence_options,
)

__all__ = [
    "ControlInput",
    "GpuAccelerator",
    "InstancePlacement",
    "ModelConfig",
    "ModelRepository",
    "batcher_options",
    "control_inputs",
    "gpu_accelerator",
    "instance_placements",
    "load_model_config",
    "model_filename",
    "model_input_names",
    "parse_config_json",
    "readiness_required",
    "sequence_options",
    "stated_config",
    "stated_readiness_required",
]
