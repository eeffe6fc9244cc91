"""The core's native ONNX Runtime executor (cpp/include/inferd/onnxruntime_executor.h): a session
that the core's worker threads run without the GIL, and the shared library it needs loaded first."""

from __future__ import annotations

import inferd._core as _core

OnnxRuntimeSession = _core.OnnxRuntimeSession


def load_onnxruntime(path: str) -> str:
    """Loads ONNX Runtime's shared library into the core, once per process (again with the same
    path: a no-op); returns its version. Raises RuntimeError with the reason, ValueError when
    another library is already loaded."""
    return _core.load_onnxruntime(path)
