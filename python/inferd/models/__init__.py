"""Model lifecycle: loading versions from the repository into executors and schedulers."""

from inferd.models.registry import LoadedModel, ModelRegistry, ModelState, ModelStatus, TensorSpec

__all__ = ["LoadedModel", "ModelRegistry", "ModelState", "ModelStatus", "TensorSpec"]
