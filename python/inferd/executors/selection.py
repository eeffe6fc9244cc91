"""Which executor runs a model version's instances: ONNX Runtime (CPU, in the core when its
library loads, or CUDA/TensorRT providers on a GPU) by default; TensorRT itself for a serialized
engine (platform tensorrt_plan) or when the config's ``inferd.executor`` parameter asks for it; a
worker process per instance for a python-backend model (backend python)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.core import Executor, HostBufferPool, ModelCalls
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
from inferd.executors.tensorrt import tensorrt_executors, wants_tensorrt
from inferd.python_backend.bls import ModelCaller
from inferd.python_backend.model_config import config_json, execution_env
from inferd.python_backend.worker_io import WorkerSpec
from inferd.repository.config import PYTHON_BACKEND
from inferd.repository.instances import GpuAccelerator, InstancePlacement
from inferd.repository.sequence_config import (
    control_inputs,
    implicit_states,
    model_input_names,
    model_output_names,
    model_output_types,
)


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
    model_calls: ModelCalls | None = None,
) -> list[Executor]:
    """One executor per placement; on failure, the ones already made are closed.
    ``model_caller`` runs a python model's calls to other models (BLS) that ``model_calls``,
    the core's router of them, has no route for; ``instance_health``
    gives each python instance the callback it reports its worker's restarts to; ``abandon``
    set (the load given up) stops a python model's initialize, its worker killed."""
    if config.sequence_batching.iterative_sequence and wants_tensorrt(config):
        raise ModelLoadError(
            f"model {config.name!r}: sequence_batching.iterative_sequence is served for ONNX "
            "models run by ONNX Runtime and python models; TensorRT is not served with it yet"
        )
    if implicit_states(config) and (config.backend == PYTHON_BACKEND or wants_tensorrt(config)):
        raise ModelLoadError(
            f"model {config.name!r}: implicit state (sequence_batching.state) is kept for ONNX "
            "models served by ONNX Runtime; a python model keeps its own state (by CORRID), "
            "a TensorRT one is not served with it yet"
        )
    if config.backend != PYTHON_BACKEND and wants_tensorrt(config):
        return list(
            tensorrt_executors(
                config, model_file, placements, accelerator, host_pool, engine_cache_dir
            )
        )

    def instance(index: int, placement: InstancePlacement) -> Executor:
        if config.backend == PYTHON_BACKEND:
            return PythonBackendExecutor(
                python_worker_spec(config, model_file, placement, index),
                model_input_names(config),
                [t.name for t in config.output],
                model_caller=model_caller,
                model_calls=model_calls,
                health=None if instance_health is None else instance_health(),
                abandon=abandon,
            )
        return _onnxruntime_executor(
            config, model_file, placement, accelerator, ort_options, host_pool
        )

    executors: list[Executor] = []
    try:
        for index, placement in enumerate(placements):
            executors.append(instance(index, placement))
    except BaseException:
        for executor in executors:
            executor.close()
        raise
    return executors


def _onnxruntime_executor(
    config: ModelConfig,
    model_file: Path,
    placement: InstancePlacement,
    accelerator: GpuAccelerator | None,
    ort_options: OnnxRuntimeOptions,
    host_pool: HostBufferPool,
) -> Executor:
    """A CPU instance runs in the core, without the GIL, when ONNX Runtime's library loads; a
    GPU instance keeps the Python executor (IOBinding on its stream), pipelined
    (StagingExecutor); a CPU one without the library has nothing to stage."""
    inputs = model_input_names(config)
    outputs = model_output_names(config)  # with the states' the config does not list
    if not placement.on_gpu and native_onnxruntime().version is not None:
        return NativeOnnxRuntimeExecutor(
            model_file,
            inputs,
            outputs,
            ort_options,
            model_output_types(config),
            model=config.name,
        )
    kind = StagingOnnxRuntimeExecutor if placement.on_gpu else OnnxRuntimeExecutor
    return kind(
        model_file,
        inputs,
        outputs,
        ort_options,
        placement=placement,
        accelerator=accelerator,
        host_pool=host_pool,
        model=config.name,
    )


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
        controls=tuple((c.name, c.datatype.config_type) for c in control_inputs(config)),
    )
