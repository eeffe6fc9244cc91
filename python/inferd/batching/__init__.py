"""The bridge to the C++ core (``inferd._core``) for Python: schedulers, buffer pools, CUDA streams
and the native ONNX Runtime session. The core's gRPC server is started by
``inferd.transport.core_server``, the only other importer."""

from inferd.batching.core import (
    CompletionDispatcher,
    CoreResult,
    CoreTensor,
    CoreTiming,
    HostBufferPool,
    ModelScheduler,
    TensorSignature,
    WireRequest,
    core_signature,
    cuda_device_count,
    cuda_runtime_description,
    parse_infer_request,
)
from inferd.batching.cuda import (
    CudaEvent,
    CudaStream,
    DeviceBuffer,
    DeviceBufferPool,
    pinned_array,
)
from inferd.batching.ensemble import CoreEnsembleStep, EnsembleScheduler, SchedulerDirectory
from inferd.batching.executor import (
    DecoupledExecutor,
    Executor,
    RequestAnsweringExecutor,
    StagingExecutor,
)
from inferd.batching.policy import BatchingPolicy, Padding, QueuePolicy

__all__ = [
    "BatchingPolicy",
    "CompletionDispatcher",
    "CoreEnsembleStep",
    "CoreResult",
    "CoreTensor",
    "CoreTiming",
    "CudaEvent",
    "CudaStream",
    "DecoupledExecutor",
    "DeviceBuffer",
    "DeviceBufferPool",
    "EnsembleScheduler",
    "Executor",
    "HostBufferPool",
    "ModelScheduler",
    "Padding",
    "QueuePolicy",
    "RequestAnsweringExecutor",
    "SchedulerDirectory",
    "StagingExecutor",
    "TensorSignature",
    "WireRequest",
    "core_signature",
    "cuda_device_count",
    "cuda_runtime_description",
    "parse_infer_request",
    "pinned_array",
]
