"""The model repository on disk: layout, versions and each model's configuration."""

from inferd.repository.config import ModelConfig, load_model_config
from inferd.repository.layout import ModelRepository

__all__ = ["ModelConfig", "ModelRepository", "load_model_config"]
