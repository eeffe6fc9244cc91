"""Executors run one model instance on one batch; the core calls them from its worker threads.
What it needs of them: ``inferd.batching.Executor`` (``StagingExecutor`` for pipelined ones)."""

from inferd.executors.onnxruntime import (
    OnnxRuntimeExecutor,
    OnnxRuntimeOptions,
    StagingOnnxRuntimeExecutor,
)

__all__ = ["OnnxRuntimeExecutor", "OnnxRuntimeOptions", "StagingOnnxRuntimeExecutor"]
