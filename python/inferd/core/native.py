"""The core's objects that Python uses as they are, with nothing to add: the gRPC and HTTP
servers, the gRPC server's trace sampling and the records of the inferences it ran while Python
observes them, the
shared-memory registry, the weighted version choice, the core's logging switches, and the
transport's status rules (the one table from the core's status codes to gRPC's, and the cut of a
status message) that Python's gRPC handlers answer by too. Re-exported here so that
``inferd.core`` stays the only importer of ``inferd._core``."""

import inferd._core as _core
from inferd._core import (
    GrpcServer,
    ObservationQueue,
    ObservedRequest,
    SharedMemoryRegistry,
    StatusCode,
    TraceBudget,
    TraceSampling,
    choose_weighted_version,
    grpc_status_code,
    set_core_logging,
    set_onnxruntime_logging,
    shown_message,
)

# A core built without its HTTP transport (INFERD_BUILD_HTTP=OFF: the GPU check's build, on a
# machine without Boost) has no HttpServer; the listeners then refuse an HTTP port, saying so.
HttpServer: type[_core.HttpServer] | None = getattr(_core, "HttpServer", None)

__all__ = [
    "GrpcServer",
    "HttpServer",
    "ObservationQueue",
    "ObservedRequest",
    "SharedMemoryRegistry",
    "StatusCode",
    "TraceBudget",
    "TraceSampling",
    "choose_weighted_version",
    "grpc_status_code",
    "set_core_logging",
    "set_onnxruntime_logging",
    "shown_message",
]
