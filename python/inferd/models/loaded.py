"""A loaded model version as it serves: its completed config, its tensors and its core scheduler.
Built by ``inferd.models.builder``, kept by ``inferd.models.registry``."""

from __future__ import annotations

from dataclasses import dataclass

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.core import EnsembleScheduler, ModelScheduler
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
    """One ready model version: its completed config, its tensors and its core scheduler. An
    ensemble's version runs on the schedulers of the (model, version) steps in ``composing``
    (version -1: the latest served)."""

    name: str
    version: int
    config: ModelConfig  # completed
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    scheduler: ModelScheduler | EnsembleScheduler
    composing: tuple[tuple[str, int], ...] = ()

    @property
    def max_batch_size(self) -> int:
        return int(self.config.max_batch_size)
