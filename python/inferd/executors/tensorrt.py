"""TensorRT itself, without ONNX Runtime: a serialized engine from the repository (platform
``tensorrt_plan``, ``<version>/model.plan``) or an ONNX model built into an engine at load time
(config parameter ``inferd.executor: "tensorrt"``), with one optimization profile covering batch
1..max_batch_size (the largest preferred batch size as the optimum) and cached on disk under a
key of GPU model, TensorRT version, precision, profile and the model's hash.

Execution: inputs are copied into the core's device buffers on the instance's stream, bound by
address (``set_tensor_address``), run with ``execute_async_v3`` on that stream, and outputs copied
back into page-locked host arrays on it; only that stream is waited for. ``tensorrt`` is imported
by the caller and passed in, so that the logic here is tested with a stand-in on machines
without it.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.core import CudaStream, DeviceBufferPool, HostBufferPool
from inferd.errors import Internal, InvalidArgument, ModelLoadError
from inferd.executors.runtime_messages import without_source_locations
from inferd.executors.staging import InputStager, copy_back
from inferd.repository.config import EXECUTOR, TENSORRT_PLATFORM
from inferd.repository.instances import GpuAccelerator, InstancePlacement
from inferd.repository.layout import model_file_label

log = structlog.get_logger(__name__)


def optimization_profile(max_batch_size: int, preferred: list[int]) -> tuple[int, int, int]:
    """(min, opt, max) batch sizes: 1..max_batch_size, the largest preferred size as optimum."""
    if max_batch_size <= 0:
        return 1, 1, 1
    opt = max((p for p in preferred if 1 <= p <= max_batch_size), default=max_batch_size)
    return 1, opt, max_batch_size


def profile_shapes(
    name: str, dims: tuple[int, ...], profile: tuple[int, int, int], batched: bool
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The input's min/opt/max shapes for the profile. Variable non-batch dims would need ranges
    the config cannot state: refused."""
    if any(d < 0 for d in dims):
        raise ModelLoadError(
            f"input {name!r} has a variable dim {list(dims)}: a TensorRT build needs fixed "
            "non-batch dims (use platform onnxruntime_onnx for it)"
        )
    if not batched:
        return dims, dims, dims
    low, opt, high = profile
    return (low, *dims), (opt, *dims), (high, *dims)


def engine_cache_path(
    cache_dir: Path,
    gpu_name: str,
    tensorrt_version: str,
    model_bytes: bytes,
    precision: str,
    profile: tuple[int, int, int],
) -> Path:
    """Where an engine built from ``model_bytes`` for this GPU, TensorRT, precision and profile
    is kept: any change of them is another file, never a stale engine."""
    digest = hashlib.sha256(model_bytes).hexdigest()[:24]
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", gpu_name).strip("-") or "gpu"
    low, opt, high = profile
    return cache_dir / f"{gpu}-trt{tensorrt_version}-{precision}-b{low}-{opt}-{high}-{digest}.plan"


def build_engine(
    trt: Any,
    onnx_bytes: bytes,
    inputs: list[tuple[str, tuple[int, ...]]],
    profile: tuple[int, int, int],
    *,
    batched: bool,
    fp16: bool,
    workspace_bytes: int | None,
) -> bytes:
    """A serialized engine for the ONNX model (TensorRT 10 networks are explicit-batch)."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        # Parser errors may name the parser's source file and line: logged, not answered.
        log.warning("TensorRT cannot parse the ONNX model", reason=errors)
        raise ModelLoadError(
            f"TensorRT cannot parse the ONNX model: {without_source_locations(errors)}"
        )
    config = builder.create_builder_config()
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    if workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    optimization = builder.create_optimization_profile()
    for name, dims in inputs:
        optimization.set_shape(name, *profile_shapes(name, dims, profile, batched))
    config.add_optimization_profile(optimization)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ModelLoadError("TensorRT could not build an engine for the model (see its log)")
    return bytes(serialized)


def cached_engine(path: Path, build: Any) -> bytes:
    """The engine at ``path``, or ``build()``'s, written there atomically for the next load."""
    if path.is_file():
        return path.read_bytes()
    engine = bytes(build())
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_bytes(engine)
    partial.replace(path)
    return engine


class TensorRtExecutor:
    """One TensorRT execution context on one instance stream, pipelined: a
    ``inferd.core.StagingExecutor``."""

    def __init__(
        self,
        trt: Any,
        engine_bytes: bytes,
        input_names: list[str],
        output_names: list[str],
        stream: CudaStream,
        device_pool: DeviceBufferPool,
        host_pool: HostBufferPool,
    ) -> None:
        self._trt = trt
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._engine = runtime.deserialize_cuda_engine(engine_bytes)
        if self._engine is None:
            raise ModelLoadError(
                "TensorRT cannot deserialize the engine (built for another GPU or TensorRT?)"
            )
        io = {
            self._engine.get_tensor_name(i): self._engine.get_tensor_mode(
                self._engine.get_tensor_name(i)
            )
            for i in range(self._engine.num_io_tensors)
        }
        for names, mode, kind in (
            (input_names, trt.TensorIOMode.INPUT, "input"),
            (output_names, trt.TensorIOMode.OUTPUT, "output"),
        ):
            missing = [n for n in names if io.get(n) != mode]
            if missing:
                raise ModelLoadError(
                    f"the engine has no {kind}(s) {missing}; its tensors are {sorted(io)}"
                )
        self._context = self._engine.create_execution_context()
        self._input_names = input_names
        self._output_names = output_names
        self._stream = stream
        self._stager = InputStager(stream.device, device_pool, stream)
        self._device_pool = device_pool
        self._host_pool = host_pool

    def stage(self, inputs: list[np.ndarray | None]) -> None:
        """Queues the copies of a batch's inputs one batch ahead (the core's stager thread)."""
        self._stager.stage(self._feeds(inputs))

    def _feeds(self, inputs: list[np.ndarray | None]) -> list[tuple[str, np.ndarray]]:
        feeds = []
        for name, array in zip(self._input_names, inputs, strict=True):
            if array is None:
                raise InvalidArgument(f"input {name!r}: TensorRT engines take every input")
            feeds.append((name, array))
        return feeds

    def execute(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        staged = self._stager.take(self._feeds(inputs))  # alive until the stream has passed it
        leased = []  # output buffers, likewise
        for name, array, buffer in zip(staged.names, staged.arrays, staged.buffers, strict=True):
            if not self._context.set_input_shape(name, tuple(array.shape)):
                raise InvalidArgument(
                    f"input {name!r}: shape {list(array.shape)} is outside the engine's profile"
                )
            self._context.set_tensor_address(name, buffer.ptr)
        outputs: list[tuple[int, tuple[int, ...], np.dtype[Any]]] = []
        for name in self._output_names:
            shape = tuple(int(d) for d in self._context.get_tensor_shape(name))
            dtype = np.dtype(self._trt.nptype(self._engine.get_tensor_dtype(name)))
            buffer = self._device_pool.lease(max(int(np.prod(shape)) * dtype.itemsize, 1))
            leased.append(buffer)
            self._context.set_tensor_address(name, buffer.ptr)
            outputs.append((buffer.ptr, shape, dtype))
        if not self._context.execute_async_v3(self._stream.handle):
            raise Internal("TensorRT failed to enqueue the batch")
        results = copy_back(self._stream, self._host_pool, outputs)
        del leased, staged
        return results

    def close(self) -> None:
        del self._context
        del self._engine


DEVICE_POOL_BYTES = 256 << 20  # per GPU instance: its device buffers for inputs and outputs


def wants_tensorrt(config: ModelConfig) -> bool:
    """Whether the config asks for TensorRT itself: a serialized engine, or the executor
    parameter naming it (else ONNX Runtime serves the model)."""
    executor = config.parameters[EXECUTOR].string_value if EXECUTOR in config.parameters else ""
    return bool(config.platform == TENSORRT_PLATFORM or executor == "tensorrt")


def tensorrt_executors(
    config: ModelConfig,
    model_file: Path,
    placements: list[InstancePlacement],
    accelerator: GpuAccelerator | None,
    host_pool: HostBufferPool,
    engine_cache_dir: Path,
) -> list[TensorRtExecutor]:
    """One TensorRT executor per placement (every one a GPU's), sharing the engine; on failure,
    the ones already made are closed."""
    cpu = [p.group for p in placements if not p.on_gpu]
    if cpu:
        raise ModelLoadError(
            f"model {config.name!r}: TensorRT runs on KIND_GPU instances; groups {cpu} are CPU"
        )
    trt = _import_tensorrt(config.name)
    engine = _engine_bytes(trt, config, model_file, accelerator, engine_cache_dir, placements)
    inputs = [t.name for t in config.input]
    outputs = [t.name for t in config.output]
    executors: list[TensorRtExecutor] = []
    try:
        for placement in placements:
            executors.append(
                TensorRtExecutor(
                    trt,
                    engine,
                    inputs,
                    outputs,
                    CudaStream(placement.device_id),
                    DeviceBufferPool(placement.device_id, DEVICE_POOL_BYTES),
                    host_pool,
                )
            )
    except BaseException:
        for executor in executors:
            executor.close()
        raise
    return executors


def _import_tensorrt(model: str) -> Any:
    try:
        return importlib.import_module("tensorrt")
    except ImportError:
        raise ModelLoadError(
            f"model {model!r} needs TensorRT: the tensorrt package is not installed "
            "(install inferd[gpu] on a machine with an NVIDIA GPU)"
        ) from None


def _read(model: str, model_file: Path) -> bytes:
    try:
        return model_file.read_bytes()
    except OSError as e:
        log.warning("cannot read a model file", path=str(model_file), error=str(e))
        raise ModelLoadError(
            f"{model_file_label(model, model_file)} cannot be read "
            f"({e.strerror or type(e).__name__})"
        ) from e


def _engine_bytes(
    trt: Any,
    config: ModelConfig,
    model_file: Path,
    accelerator: GpuAccelerator | None,
    cache_dir: Path,
    placements: list[InstancePlacement],
) -> bytes:
    """The engine: the repository's (tensorrt_plan), or one built from the ONNX model, kept in
    the server's engine cache (whose path messages to clients leave to the log)."""
    if config.platform == TENSORRT_PLATFORM:
        return _read(config.name, model_file)
    parameters = accelerator.parameters if accelerator is not None else {}
    fp16 = parameters.get("precision_mode") == "FP16"
    workspace = (
        int(parameters["max_workspace_size_bytes"])
        if "max_workspace_size_bytes" in parameters
        else None
    )
    profile = optimization_profile(
        int(config.max_batch_size), list(config.dynamic_batching.preferred_batch_size)
    )
    onnx_bytes = _read(config.name, model_file)
    path = engine_cache_path(
        cache_dir,
        _gpu_name(placements[0].device_id),
        str(trt.__version__),
        onnx_bytes,
        "fp16" if fp16 else "fp32",
        profile,
    )
    inputs = [(t.name, tuple(int(d) for d in t.dims)) for t in config.input]
    try:
        return cached_engine(
            path,
            lambda: build_engine(
                trt,
                onnx_bytes,
                inputs,
                profile,
                batched=config.max_batch_size > 0,
                fp16=fp16,
                workspace_bytes=workspace,
            ),
        )
    except OSError as e:
        log.warning("TensorRT engine cache unusable", path=str(path), error=str(e))
        raise ModelLoadError(
            f"model {config.name!r}: the TensorRT engine cache cannot be used "
            f"({e.strerror or type(e).__name__}; the server log names the file)"
        ) from e


def _gpu_name(device: int) -> str:
    """The GPU's model name for the engine cache key (NVML, from the gpu extra)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(device))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no NVML: still a key, shared by every GPU of this machine
        return f"cuda-device-{device}"
