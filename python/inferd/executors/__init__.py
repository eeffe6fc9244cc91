"""Executors run one model instance on one batch; the core calls them from its worker threads.
What it needs of them: ``inferd.core.Executor`` (``StagingExecutor`` for pipelined ones)."""

from inferd.executors.onnxruntime import (
    OnnxRuntimeExecutor,
    OnnxRuntimeOptions,
    StagingOnnxRuntimeExecutor,
)

__all__ = ["OnnxRuntimeExecutor", "OnnxRuntimeOptions", "StagingOnnxRuntimeExecutor"]
