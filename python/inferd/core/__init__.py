"""The bridge to the C++ core (``inferd._core``) for Python, and its only importer: schedulers,
buffer pools, CUDA streams, the native ONNX Runtime session, and the core's objects the rest of
the package constructs (``native``: the gRPC server that ``inferd.transport.core_server`` starts,
shared memory, logging)."""

from inferd.core.cuda import (
    CudaEvent,
    CudaStream,
    DeviceBuffer,
    DeviceBufferPool,
    pinned_array,
)
from inferd.core.ensemble import CoreEnsembleStep, EnsembleScheduler, SchedulerDirectory
from inferd.core.executor import (
    DecoupledExecutor,
    Executor,
    RequestAnsweringExecutor,
    StagingExecutor,
)
from inferd.core.native import (
    GrpcServer,
    SharedMemoryRegistry,
    StatusCode,
    TraceSampling,
    choose_weighted_version,
    grpc_status_code,
    set_core_logging,
    set_onnxruntime_logging,
    shown_message,
)
from inferd.core.policy import BatcherOptions, Padding, QueuePolicy
from inferd.core.scheduler import (
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

__all__ = [
    "BatcherOptions",
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
    "GrpcServer",
    "HostBufferPool",
    "ModelScheduler",
    "Padding",
    "QueuePolicy",
    "RequestAnsweringExecutor",
    "SchedulerDirectory",
    "SharedMemoryRegistry",
    "StagingExecutor",
    "StatusCode",
    "TensorSignature",
    "TraceSampling",
    "WireRequest",
    "choose_weighted_version",
    "core_signature",
    "cuda_device_count",
    "cuda_runtime_description",
    "grpc_status_code",
    "parse_infer_request",
    "pinned_array",
    "set_core_logging",
    "set_onnxruntime_logging",
    "shown_message",
]
