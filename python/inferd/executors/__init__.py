"""Executors: run one model instance on one batch. The core calls ``execute`` from its worker thread."""

from inferd.executors.base import Executor
from inferd.executors.onnxruntime import OnnxRuntimeExecutor, OnnxRuntimeOptions

__all__ = ["Executor", "OnnxRuntimeExecutor", "OnnxRuntimeOptions"]
