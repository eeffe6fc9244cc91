"""Executors run one model instance on one batch; the core calls them from its worker threads."""

from inferd.executors.base import Executor
from inferd.executors.onnxruntime import OnnxRuntimeExecutor, OnnxRuntimeOptions

__all__ = ["Executor", "OnnxRuntimeExecutor", "OnnxRuntimeOptions"]
