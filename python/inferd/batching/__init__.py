"""The bridge to the C++ core (``inferd._core``): the only package that imports it."""

from inferd.batching.core import CompletionDispatcher, CoreTensor, ModelScheduler

__all__ = ["CompletionDispatcher", "CoreTensor", "ModelScheduler"]
