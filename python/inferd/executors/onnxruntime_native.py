"""ONNX Runtime on the CPU inside the C++ core: sessions set up as ``OnnxRuntimeExecutor`` sets up
its CPU sessions, but the core's worker threads run batches through ONNX Runtime's C API without
taking the GIL, so the event loop no longer starves them (nor they it).

The core loads ONNX Runtime's shared library at run time; the library comes from the installed
onnxruntime wheel (``onnxruntime/capi/libonnxruntime.so*``), found without importing the package.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog

from inferd.core.onnxruntime import OnnxRuntimeSession, load_onnxruntime
from inferd.errors import error_for_code
from inferd.executors.onnxruntime import OnnxRuntimeOptions, load_failure

log = structlog.get_logger(__name__)


def onnxruntime_library() -> Path:
    """The onnxruntime wheel's shared library. Raises FileNotFoundError saying what is missing."""
    spec = importlib.util.find_spec("onnxruntime")  # locates the package; imports nothing
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the onnxruntime package is not installed")
    folders = [Path(location, "capi") for location in spec.submodule_search_locations]
    for folder in folders:
        libraries = sorted(folder.glob("libonnxruntime.so*"))
        if libraries:
            return libraries[0]
    raise FileNotFoundError(f"no libonnxruntime.so* in {', '.join(map(str, folders))}")


@dataclass(frozen=True)
class NativeOnnxRuntime:
    """Whether the native executor can run here: the loaded library's version, or why not."""

    version: str | None
    reason: str = ""


@functools.cache
def native_onnxruntime() -> NativeOnnxRuntime:
    """Loads the wheel's ONNX Runtime library into the core, once, and logs the outcome. (Two
    first calls at once may both load and log: harmless, as the core loads a path only once.)"""
    try:
        path = onnxruntime_library()
        version = load_onnxruntime(str(path))
    except (OSError, RuntimeError, ValueError) as e:
        log.warning("native ONNX Runtime executor unavailable, using the Python one", reason=str(e))
        return NativeOnnxRuntime(None, str(e))
    log.info("native ONNX Runtime executor", library=str(path), version=version)
    return NativeOnnxRuntime(version)


class NativeOnnxRuntimeExecutor:
    """Runs an ONNX model with ONNX Runtime's CPU provider in the core. See
    ``inferd.core.Executor``; ``core_session`` is what the core's scheduler runs (the
    scheduler then never calls ``execute``, which is here for warm-up).

    ONNX Runtime's C API takes any bytes as a string element; requests whose BYTES are not UTF-8
    (which ONNX strings must be) are refused earlier, by the core's request checks. ``model``,
    the model's name, makes load failures name the model and version rather than ``model_path``.
    """

    def __init__(
        self,
        model_path: Path,
        input_names: list[str],
        output_names: list[str],
        options: OnnxRuntimeOptions,
        output_datatypes: list[int],
        *,
        model: str = "",
    ) -> None:
        runtime = native_onnxruntime()
        if runtime.version is None:  # the reason (logged) may name the library's path
            raise load_failure(model, model_path, "no native ONNX Runtime (see the server log)")
        try:
            self.core_session = OnnxRuntimeSession(
                str(model_path),
                input_names,
                output_names,
                output_datatypes,
                options.intra_op_thread_count,
                options.inter_op_thread_count,
                options.graph_optimization_level,
            )
        except (RuntimeError, ValueError) as e:  # "<model_path>: <the reason>"
            reason = str(e).removeprefix(f"{model_path}: ")
            raise load_failure(model, model_path, reason) from None

    def execute(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        try:
            return self.core_session.execute(inputs)
        except (RuntimeError, ValueError) as e:
            code = getattr(e, "code", None)  # set by the core for a failed batch
            if code is None:
                raise
            raise error_for_code(code, str(e)) from None

    def close(self) -> None:
        # The scheduler holds its own share of the session; this drops the executor's.
        del self.core_session
