"""The core's objects that Python constructs as they are, with nothing to add: the gRPC server and
its trace sampling, the shared-memory registry, the weighted version choice and the core's logging
switches. Re-exported here so that ``inferd.core`` stays the only importer of ``inferd._core``."""

from inferd._core import (
    GrpcServer,
    SharedMemoryRegistry,
    TraceSampling,
    choose_weighted_version,
    set_core_logging,
    set_onnxruntime_logging,
)

__all__ = [
    "GrpcServer",
    "SharedMemoryRegistry",
    "TraceSampling",
    "choose_weighted_version",
    "set_core_logging",
    "set_onnxruntime_logging",
]
