"""The bridge to the C++ core (``inferd._core``): the only package that imports it."""

from inferd.batching.core import CompletionDispatcher, CoreTensor, HostBufferPool, ModelScheduler
from inferd.batching.policy import BatchingPolicy, Padding, QueuePolicy

__all__ = [
    "BatchingPolicy",
    "CompletionDispatcher",
    "CoreTensor",
    "HostBufferPool",
    "ModelScheduler",
    "Padding",
    "QueuePolicy",
]
