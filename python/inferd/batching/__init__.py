"""The bridge to the C++ core (``inferd._core``): the only package that imports it."""

from inferd.batching.core import (
    CompletionDispatcher,
    CoreTensor,
    HostBufferPool,
    ModelScheduler,
    cuda_device_count,
    cuda_runtime_description,
)
from inferd.batching.policy import BatchingPolicy, Padding, QueuePolicy

__all__ = [
    "BatchingPolicy",
    "CompletionDispatcher",
    "CoreTensor",
    "HostBufferPool",
    "ModelScheduler",
    "Padding",
    "QueuePolicy",
    "cuda_device_count",
    "cuda_runtime_description",
]
