"""Which executor runs a model version's instances: ONNX Runtime (CPU, in the core when its
library loads, or CUDA/TensorRT providers on a GPU) by default; TensorRT itself for a serialized
engine (platform tensorrt_plan) or when the config's ``inferd.executor`` parameter asks for it; a
worker process per instance for a python-backend model (backend python)."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.core import CudaStream, DeviceBufferPool, Executor, HostBufferPool
from inferd.errors import ModelLoadError
from inferd.executors.onnxruntime import (
    OnnxRuntimeExecutor,
    OnnxRuntimeOptions,
    StagingOnnxRuntimeExecutor,
)
from inferd.executors.onnxruntime_native import (
    NativeOnnxRuntimeExecutor,
    native_onnxruntime,
)
from inferd.executors.python_backend import InstanceHealth, PythonBackendExecutor
from inferd.executors.tensorrt import (
    TensorRtExecutor,
    build_engine,
    cached_engine,
    engine_cache_path,
    optimization_profile,
)
from inferd.python_backend.bls import ModelCaller
from inferd.python_backend.model_config import config_json, execution_env
from inferd.python_backend.process import WorkerSpec
from inferd.repository.config import EXECUTOR, PYTHON_BACKEND, TENSORRT_PLATFORM
from inferd.repository.instances import GpuAccelerator, InstancePlacement
from inferd.repository.layout import model_file_label

log = structlog.get_logger(__name__)

DEVICE_POOL_BYTES = 256 << 20  # per GPU instance: its device buffers for inputs and outputs


def wants_tensorrt(config: ModelConfig) -> bool:
    executor = config.parameters[EXECUTOR].string_value if EXECUTOR in config.parameters else ""
    return bool(config.platform == TENSORRT_PLATFORM or executor == "tensorrt")


def create_executors(
    config: ModelConfig,
    model_file: Path,
    placements: list[InstancePlacement],
    accelerator: GpuAccelerator | None,
    ort_options: OnnxRuntimeOptions,
    host_pool: HostBufferPool,
    engine_cache_dir: Path,
    model_caller: ModelCaller | None = None,
    instance_health: Callable[[], InstanceHealth] | None = None,
    abandon: threading.Event | None = None,
) -> list[Executor]:
    """One executor per placement; on failure, the ones already made are closed.
    ``model_caller`` runs a python model's calls to other models (BLS); ``instance_health``
    gives each python instance the callback it reports its worker's restarts to; ``abandon``
    set (the load given up) stops a python model's initialize, its worker killed."""
    inputs = [t.name for t in config.input]
    outputs = [t.name for t in config.output]
    executors: list[Executor] = []
    try:
        if config.backend == PYTHON_BACKEND:
            for index, placement in enumerate(placements):
                executors.append(
                    PythonBackendExecutor(
                        python_worker_spec(config, model_file, placement, index),
                        inputs,
                        outputs,
                        model_caller=model_caller,
                        health=None if instance_health is None else instance_health(),
                        abandon=abandon,
                    )
                )
            return executors
        if not wants_tensorrt(config):
            output_datatypes = [int(t.data_type) for t in config.output]
            for placement in placements:
                # CPU instances run in the core, without the GIL, when ONNX Runtime's library
                # loads; GPU instances keep the Python executor (IOBinding on their stream).
                if not placement.on_gpu and native_onnxruntime().version is not None:
                    executors.append(
                        NativeOnnxRuntimeExecutor(
                            model_file,
                            inputs,
                            outputs,
                            ort_options,
                            output_datatypes,
                            model=config.name,
                        )
                    )
                    continue
                # A GPU instance is pipelined (StagingExecutor); a CPU one has nothing to stage.
                kind = StagingOnnxRuntimeExecutor if placement.on_gpu else OnnxRuntimeExecutor
                executors.append(
                    kind(
                        model_file,
                        inputs,
                        outputs,
                        ort_options,
                        placement=placement,
                        accelerator=accelerator,
                        host_pool=host_pool,
                        model=config.name,
                    )
                )
            return executors
        cpu = [p.group for p in placements if not p.on_gpu]
        if cpu:
            raise ModelLoadError(
                f"model {config.name!r}: TensorRT runs on KIND_GPU instances; groups {cpu} are CPU"
            )
        trt = _import_tensorrt(config.name)
        engine = _engine_bytes(trt, config, model_file, accelerator, engine_cache_dir, placements)
        for placement in placements:
            stream = CudaStream(placement.device_id)
            executors.append(
                TensorRtExecutor(
                    trt,
                    engine,
                    inputs,
                    outputs,
                    stream,
                    DeviceBufferPool(placement.device_id, DEVICE_POOL_BYTES),
                    host_pool,
                )
            )
        return executors
    except BaseException:
        for executor in executors:
            executor.close()
        raise


def python_worker_spec(
    config: ModelConfig, model_file: Path, placement: InstancePlacement, index: int
) -> WorkerSpec:
    """How one instance's worker starts: Triton's initialize arguments and the model's file."""
    model_dir = model_file.parent.parent
    return WorkerSpec(
        model_name=config.name,
        model_version=int(model_file.parent.name),
        instance_name=f"{config.name}_{index}",
        model_file=model_file,
        model_config_json=config_json(config),
        model_repository=model_dir,
        instance_kind="GPU" if placement.on_gpu else "CPU",
        device_id=max(placement.device_id, 0),
        execution_env=execution_env(config, model_dir),
    )


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
