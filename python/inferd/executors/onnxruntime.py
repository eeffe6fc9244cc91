"""ONNX Runtime's Python API: one InferenceSession per model instance, created once at load.

The server runs GPU instances with it (the CUDA provider, behind ONNX Runtime's TensorRT provider
when the config asks; IOBinding on the instance's stream, see ``inferd.executors.iobinding``), and
CPU instances only where the core's native executor (``inferd.executors.onnxruntime_native``)
cannot load ONNX Runtime's library."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from inferd.core import CudaStream, DeviceBufferPool, HostBufferPool
from inferd.errors import InferdError, Internal, InvalidArgument, ModelLoadError
from inferd.executors.iobinding import IoBindingRunner
from inferd.executors.runtime_messages import without_source_locations
from inferd.repository.instances import GpuAccelerator, InstancePlacement
from inferd.repository.layout import model_file_label, without_model_dir
from inferd.repository.ranges import MAX_THREAD_COUNT, check_range

log = structlog.get_logger(__name__)

_BF16_ONNX_TYPE = 16  # onnx.TensorProto.BFLOAT16


@dataclass(frozen=True)
class OnnxRuntimeOptions:
    """Session settings. Per model from config ``parameters`` (Triton's ORT backend keys
    ``intra_op_thread_count`` / ``inter_op_thread_count``), else the server-wide defaults."""

    intra_op_thread_count: int
    inter_op_thread_count: int
    # ORT's GraphOptimizationLevel (0 none, 1 basic, 2 extended, 99 all), from the config's
    # optimization { graph { level } } in Triton's terms (graph_optimization_level()).
    graph_optimization_level: int = 99

    @classmethod
    def from_parameters(
        cls, parameters: dict[str, str], default: OnnxRuntimeOptions
    ) -> OnnxRuntimeOptions:
        def count(key: str, fallback: int) -> int:
            if key not in parameters:
                return fallback
            try:
                value = int(parameters[key])
            except ValueError:
                raise ModelLoadError(
                    f"parameter {key!r} must be an integer, got {parameters[key]!r}"
                ) from None
            return check_range(f"parameter {key!r}", value, 0, MAX_THREAD_COUNT)

        return cls(
            count("intra_op_thread_count", default.intra_op_thread_count),
            count("inter_op_thread_count", default.inter_op_thread_count),
        )


# Triton's ONNX Runtime backend's optimization.graph.level -> ORT's GraphOptimizationLevel: 0 (not
# set) all, -1 basic, 1 basic and extended, 2 none.
_TRITON_GRAPH_LEVELS = {0: 99, -1: 1, 1: 2, 2: 0}


def graph_optimization_level(level: int) -> int:
    """ORT's GraphOptimizationLevel for a config's ``optimization { graph { level } }``."""
    if level not in _TRITON_GRAPH_LEVELS:
        raise ModelLoadError(
            f"optimization.graph.level {level}: ONNX Runtime models take -1 (basic), 1 (basic and "
            "extended), 2 (none) or 0 (all, the default)"
        )
    return _TRITON_GRAPH_LEVELS[level]


def default_intra_op_threads() -> int:
    """One compute thread per core this process may run on, less one for the gRPC front end:
    the event loop and the executors' Python calls need a core of their own (measured on 2
    cores: mlp at concurrency 64 served 2881 infer/s with 1 thread, 2289 with 2)."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


ProviderList = list[tuple[str, dict[str, str]]]


def onnxruntime_providers(
    placement: InstancePlacement,
    accelerator: GpuAccelerator | None,
    available: list[str],
    stream_handle: int = 0,
) -> ProviderList:
    """ONNX Runtime's execution providers, with options, for one instance: the CPU provider, or
    CUDA on the instance's device, behind TensorRT when the config asks for it. ``available``:
    what the installed onnxruntime offers; a provider it lacks fails the load by name.
    ``stream_handle``: the instance's cudaStream_t, which the GPU providers then compute on."""
    if not placement.on_gpu:
        return [("CPUExecutionProvider", {})]
    device = {"device_id": str(placement.device_id)}
    if stream_handle:
        device |= {"has_user_compute_stream": "1", "user_compute_stream": str(stream_handle)}

    def need(provider: str, why: str) -> None:
        if provider not in available:
            raise ModelLoadError(
                f"instance {placement.group!r} on GPU {placement.device_id} needs {provider} "
                f"for {why}; the installed onnxruntime offers {available} "
                "(install the gpu extra: inferd[gpu])"
            )

    need("CUDAExecutionProvider", "KIND_GPU")
    cuda = dict(device)
    if accelerator is not None and accelerator.name == "cuda":
        cuda.update(accelerator.parameters)
    providers: ProviderList = [("CUDAExecutionProvider", cuda)]
    if accelerator is not None and accelerator.name == "tensorrt":
        need("TensorrtExecutionProvider", 'gpu_execution_accelerator "tensorrt"')
        parameters = accelerator.parameters
        tensorrt = dict(device)
        tensorrt["trt_fp16_enable"] = str(parameters.get("precision_mode") == "FP16")
        if "max_workspace_size_bytes" in parameters:
            tensorrt["trt_max_workspace_size"] = parameters["max_workspace_size_bytes"]
        if parameters.get("trt_engine_cache_enable", "false").lower() in ("true", "1"):
            tensorrt["trt_engine_cache_enable"] = "True"
            tensorrt["trt_engine_cache_path"] = parameters.get("trt_engine_cache_path", "")
        providers.insert(0, ("TensorrtExecutionProvider", tensorrt))
    return providers


def load_failure(model: str, model_path: Path, reason: str) -> ModelLoadError:
    """ONNX Runtime's refusal of ``model_path`` as the load's error. With ``model``, the model's
    name, the message names the model, version and file and no server path (ONNX Runtime's own
    message has the file's path), for clients; the log keeps the original."""
    if not model:
        return ModelLoadError(f"{model_path}: {reason}")
    log.warning("ONNX Runtime cannot load a model file", path=str(model_path), reason=reason)
    label = model_file_label(model, model_path)
    return ModelLoadError(f"{label}: {without_model_dir(reason, model_path)}")


class OnnxRuntimeExecutor:
    """Runs an ONNX model with ONNX Runtime: the CPU provider, or CUDA (and TensorRT) for an
    instance placed on a GPU. See ``inferd.core.Executor``. ``model``, the model's
    name, makes load failures name the model and version rather than ``model_path``.

    ONNX Runtime's Python API takes strings as ``str``, so BYTES inputs must be UTF-8 (anything
    else is INVALID_ARGUMENT rather than silently mangled); BF16 has no numpy dtype, so BF16
    tensors go through OrtValues holding the raw 16-bit patterns.
    """

    def __init__(
        self,
        model_path: Path,
        input_names: list[str],
        output_names: list[str],
        options: OnnxRuntimeOptions,
        *,
        placement: InstancePlacement | None = None,
        accelerator: GpuAccelerator | None = None,
        host_pool: HostBufferPool | None = None,
        device_pool_bytes: int = 256 << 20,
        model: str = "",
    ) -> None:
        import onnxruntime as ort  # deferred: the GPU build installs a different package

        session_options = ort.SessionOptions()
        session_options.intra_op_num_threads = options.intra_op_thread_count
        session_options.inter_op_num_threads = options.inter_op_thread_count
        session_options.graph_optimization_level = ort.GraphOptimizationLevel(
            options.graph_optimization_level
        )
        # ORT's pool threads spin after each run by default, taking the cores the gRPC front end
        # and the core's workers need between batches.
        session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session_options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        # ORT's Python API writes its records to stderr unstructured (ANSI-coloured) and takes no
        # logging function (the core's native sessions do: their records are inferd's): keep only
        # fatal ones. Its errors still reach inferd as exceptions, logged as load or INTERNAL
        # failures.
        session_options.log_severity_level = 4
        placement = placement or InstancePlacement("cpu")
        stream = None
        if placement.on_gpu:
            stream = CudaStream(placement.device_id)
        providers = onnxruntime_providers(
            placement,
            accelerator,
            ort.get_available_providers(),
            stream.handle if stream is not None else 0,
        )
        try:
            self._session = ort.InferenceSession(
                str(model_path),
                sess_options=session_options,
                providers=[name for name, _ in providers],
                provider_options=[provider_options for _, provider_options in providers],
            )
        except Exception as e:
            raise load_failure(model, model_path, f"ONNX Runtime cannot load it: {e}") from e
        self._ort = ort
        self._input_names = input_names
        self._output_names = output_names
        types = {
            i.name: i.type
            for i in (
                *self._session.get_inputs(),
                *self._session.get_overridable_initializers(),  # optional inputs
                *self._session.get_outputs(),
            )
        }
        self._string_inputs = [types[n] == "tensor(string)" for n in input_names]
        self._bf16_inputs = [types[n] == "tensor(bfloat16)" for n in input_names]
        self._uses_ortvalues = any(self._bf16_inputs) or any(
            types[n] == "tensor(bfloat16)" for n in output_names
        )
        self._gpu: IoBindingRunner | None = None
        if stream is not None:
            self._gpu = _gpu_runner(
                ort, self._session, stream, host_pool, output_names, types, device_pool_bytes
            )

    def execute(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        try:
            return self._run(inputs)
        except InferdError:
            raise
        except Exception as e:  # ONNX Runtime's own exception classes
            # The client reads ORT's message without where in ORT's source it failed; the log
            # keeps the full text.
            log.warning("ONNX Runtime failed a run", reason=str(e))
            raise Internal(f"ONNX Runtime: {without_source_locations(str(e))}") from None

    def _run(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        # An optional input left out (None) is not fed: the model's initializer stands in.
        feeds = [
            (name, _utf8_strings(array, name) if is_string else array, is_bf16)
            for array, name, is_string, is_bf16 in zip(
                inputs, self._input_names, self._string_inputs, self._bf16_inputs, strict=True
            )
            if array is not None
        ]
        if self._gpu is not None:
            return self._gpu.run([(name, array) for name, array, _ in feeds])
        if not self._uses_ortvalues:
            # session.run releases the GIL while it computes.
            outputs: list[np.ndarray] = self._session.run(
                self._output_names, {name: array for name, array, _ in feeds}
            )
            return outputs
        values = {
            name: (
                self._ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array, _BF16_ONNX_TYPE)
                if is_bf16
                else self._ort.OrtValue.ortvalue_from_numpy(array)
            )
            for name, array, is_bf16 in feeds
        }
        results = self._session.run_with_ort_values(self._output_names, values)
        return [_to_numpy(value) for value in results]

    def close(self) -> None:
        # Dropping the session frees its memory; there is nothing else to release.
        del self._session


class StagingOnnxRuntimeExecutor(OnnxRuntimeExecutor):
    """A GPU instance of ``OnnxRuntimeExecutor`` whose batches the core pipelines (see
    ``inferd.core.StagingExecutor``): ``stage`` queues a batch's input copies on the copy
    stream one batch ahead. Only GPU instances are made of this class, so a CPU instance has no
    ``stage`` for the core to call. An ``OnnxRuntimeExecutor`` on a GPU, used on its own, copies
    its inputs inline instead."""

    def __init__(
        self,
        model_path: Path,
        input_names: list[str],
        output_names: list[str],
        options: OnnxRuntimeOptions,
        *,
        placement: InstancePlacement,
        accelerator: GpuAccelerator | None = None,
        host_pool: HostBufferPool | None = None,
        device_pool_bytes: int = 256 << 20,
        model: str = "",
    ) -> None:
        if not placement.on_gpu:
            raise ValueError(f"instance {placement.group!r} is not on a GPU: nothing to stage")
        super().__init__(
            model_path,
            input_names,
            output_names,
            options,
            placement=placement,
            accelerator=accelerator,
            host_pool=host_pool,
            device_pool_bytes=device_pool_bytes,
            model=model,
        )

    def stage(self, inputs: list[np.ndarray | None]) -> None:
        """Queues the copies of a batch's inputs one batch ahead (the core's stager thread)."""
        assert self._gpu is not None  # a GPU placement, checked above
        self._gpu.stage(
            [(n, a) for n, a in zip(self._input_names, inputs, strict=True) if a is not None]
        )


def _gpu_runner(
    ort: Any,
    session: Any,
    stream: CudaStream,
    host_pool: HostBufferPool | None,
    output_names: list[str],
    types: dict[str, str],
    device_pool_bytes: int,
) -> IoBindingRunner:
    refused = sorted(n for n, t in types.items() if t in ("tensor(string)", "tensor(bfloat16)"))
    if refused:
        raise ModelLoadError(
            f"tensors {refused} are BYTES or BF16, which inferd's GPU path does not carry yet; "
            "place this model on KIND_CPU"
        )
    if host_pool is None:
        raise ModelLoadError("a GPU instance needs the server's host buffer pool")
    return IoBindingRunner(
        ort,
        session,
        stream,
        DeviceBufferPool(stream.device, device_pool_bytes),
        host_pool,
        output_names,
    )


def _utf8_strings(array: np.ndarray, name: str) -> np.ndarray:
    out = np.empty(array.shape, dtype=object)
    flat_in, flat_out = array.reshape(-1), out.reshape(-1)
    for i, element in enumerate(flat_in):
        try:
            flat_out[i] = element.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(
                f"input {name!r} element {i} is not UTF-8 text, which ONNX Runtime strings require"
            ) from None
    return out


def _to_numpy(value: Any) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        result: np.ndarray = value.numpy()
        return result
    # No numpy dtype for bfloat16: copy the raw 16-bit patterns out as uint16.
    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.zeros(shape, dtype=np.uint16)
    buffer = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.ctypeslib.as_array(buffer).reshape(shape).copy()
