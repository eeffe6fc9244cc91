"""A loaded model version as it serves: its completed config, its tensors and its core scheduler.
Built by ``inferd.models.builder``, kept by ``inferd.models.registry``."""

from __future__ import annotations

from dataclasses import dataclass

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.batching import ModelScheduler
from inferd.datatypes import Datatype


@dataclass(frozen=True)
class TensorSpec:
    """An input or output as the completed config declares it (dims exclude the batch dim)."""

    name: str
    datatype: Datatype
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None  # the model's dims, when they differ from the API's
    optional: bool = False  # an input a request may leave out


@dataclass
class LoadedModel:
    """One ready model version: its completed config, its tensors and its core scheduler."""

    name: str
    version: int
    config: ModelConfig  # completed
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    scheduler: ModelScheduler

    @property
    def max_batch_size(self) -> int:
        return int(self.config.max_batch_size)
