"""Model lifecycle: loading versions from the repository into executors and schedulers."""

from inferd.models.builder import ModelVersionBuilder
from inferd.models.loaded import LoadedModel, TensorSpec
from inferd.models.registry import ModelRegistry
from inferd.models.serving import ModelState, ModelStatus, ReadinessRules

__all__ = [
    "LoadedModel",
    "ModelRegistry",
    "ModelState",
    "ModelStatus",
    "ModelVersionBuilder",
    "ReadinessRules",
    "TensorSpec",
]
