"""``inference.GRPCInferenceService`` in Python: a handler decodes, calls the data plane, encodes.

Clients reach it through the core's gRPC server (``core_server.py``), which forwards here every call
it does not answer itself: the control plane, and inference whose model the core has no route for
(so that the answer is this service's, in its words) or that a sampler the core cannot apply
traces. It serves on a private Unix socket only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

import inferd._proto.grpc_service_pb2 as pb
import inferd._proto.grpc_service_pb2_grpc as grpc_service_pb2_grpc
from inferd import __version__
from inferd.dataplane import DataPlane
from inferd.errors import InvalidArgument
from inferd.models.control import ModelControl
from inferd.observability.logging import apply_log_settings
from inferd.observability.telemetry import Telemetry
from inferd.shared_memory import PeerCredentials, SharedMemory, SharedMemoryKind
from inferd.transport import codec
from inferd.transport.status import answers_errors

# Protocol extensions inferd implements (ServerMetadata.extensions, on both protocols), by
# Triton's names; perf_analyzer reads ModelStatistics only when "statistics" is listed.
# binary_tensor_data is HTTP's (the core serves it). The shared-memory extensions are added
# where --shared-memory enables them.
EXTENSIONS = [
    "model_configuration",
    "model_repository",
    "statistics",
    "schedule_policy",
    "trace",
    "logging",
    "parameters",
    "binary_tensor_data",
    "sequence",  # sequence_batching: sequence_id, sequence_start, sequence_end
    "sequence(string_id)",
]

# Set by the core's server on an inference it forwards from a listener that serves shared memory
# (--shared-memory-listeners; a client's own header of that name is dropped): only such a request
# may name a region.
SHARED_MEMORY_ALLOWED = ("inferd-shared-memory", "1")
# The core adds it to a call from its Unix socket: "PID UID GID" (SO_PEERCRED); a client's own is
# dropped (grpc_calls.h, kPeerCredentialsKey).
PEER_CREDENTIALS = "inferd-peer-credentials"
# The core adds it to an inference it routed before forwarding it here: the version its route
# chose (grpc_calls.h, kRoutedVersionKey); a client's own is dropped.
ROUTED_VERSION = "inferd-routed-version"


def routed_version(context: grpc.aio.ServicerContext) -> str | None:
    """The version the core's transport routed the forwarded inference to; None if it had no
    route (Python answers in the registry's words)."""
    for key, value in context.invocation_metadata() or ():
        if key == ROUTED_VERSION:
            return str(value)
    return None


def peer_credentials(context: grpc.aio.ServicerContext) -> PeerCredentials | None:
    """The Unix-socket client's credentials the core passed on; None for a TCP client."""
    for key, value in context.invocation_metadata() or ():
        if key == PEER_CREDENTIALS:
            pid, uid, gid = (int(part) for part in str(value).split())
            return PeerCredentials(pid, uid, gid)
    return None


class ServerState:
    """What liveness and readiness report. Set by the server's start and stop."""

    def __init__(self) -> None:
        self.live = True
        self.accepting = False  # false before start and once shutdown begins


class InferenceServicer(grpc_service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(
        self,
        dataplane: DataPlane,
        control: ModelControl,
        state: ServerState,
        telemetry: Telemetry,
        settings_changed: Callable[[], None] | None = None,
        shared_memory: SharedMemory | None = None,
    ) -> None:
        self._dataplane = dataplane
        self._control = control
        self._state = state
        self._telemetry = telemetry
        # Told after LogSettings and TraceSetting: whether requests are observed (verbose logs)
        # and how the core samples them may have changed.
        self._settings_changed = settings_changed
        self._shared_memory = shared_memory or SharedMemory("none", max_regions=0, max_bytes=0)

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerLiveResponse(live=self._state.live)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        ready = self._state.accepting and self._dataplane.server_ready()
        return pb.ServerReadyResponse(ready=ready)

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        ready = self._dataplane.ready(request.name, request.version)
        return pb.ModelReadyResponse(ready=ready and self._state.accepting)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        extensions = EXTENSIONS + self._shared_memory.extensions()
        return pb.ServerMetadataResponse(name="inferd", version=__version__, extensions=extensions)

    @answers_errors
    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        model, versions = self._dataplane.metadata(request.name, request.version)
        return codec.encode_model_metadata(model, versions)

    @answers_errors
    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        config = self._dataplane.config(request.name, request.version)
        return pb.ModelConfigResponse(config=config)

    @answers_errors
    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return codec.encode_model_statistics(
            self._dataplane.statistics(request.name, request.version)
        )

    @answers_errors
    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return codec.encode_repository_index(self._control.index(), request.ready)

    @answers_errors
    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._control.load(request.model_name, codec.parameters(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @answers_errors
    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._control.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    @answers_errors
    async def ModelInfer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Bytes in, bytes out: the core parses the request and writes the answer. The core's
        server sends here what it does not run itself, each request of a stream included: those
        naming a model version it has no route for, and every one while Python traces by a
        sampler the core cannot apply (a span, a failure count, a log line)."""
        parsed = self._dataplane.parse(request)
        deadline_s = context.time_remaining()
        telemetry = self._telemetry
        allowed = SHARED_MEMORY_ALLOWED in (context.invocation_metadata() or ())
        shared_memory = (
            self._shared_memory.core if allowed and self._shared_memory.enabled else None
        )
        version = routed_version(context)
        try:
            if not telemetry.observes_each_request:

                def failed(model: str, version: str, error: BaseException) -> None:
                    telemetry.failed(
                        model,
                        version,
                        error,
                        request_id=parsed.id,
                        metadata=context.invocation_metadata(),
                    )

                return await self._dataplane.infer(
                    parsed,
                    deadline_s=deadline_s,
                    on_failure=failed,
                    shared_memory=shared_memory,
                    routed_version=version,
                )
            metadata = context.invocation_metadata()
            with telemetry.request(parsed.model_name, metadata, parsed.id) as observed:
                return await self._dataplane.infer(
                    parsed,
                    deadline_s=deadline_s,
                    observed=observed,
                    shared_memory=shared_memory,
                    routed_version=version,
                )
        except Exception as e:
            telemetry.unresolved(
                parsed.model_name,
                parsed.model_version,
                e,
                request_id=parsed.id,
                metadata=context.invocation_metadata(),
            )
            raise

    @answers_errors
    async def SystemSharedMemoryStatus(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        regions = self._shared_memory.status(SharedMemoryKind.SYSTEM, request.name)
        return pb.SystemSharedMemoryStatusResponse(
            regions={
                r.name: pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size
                )
                for r in regions
            }
        )

    @answers_errors
    async def SystemSharedMemoryRegister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        await self._shared_memory.register_system(
            request.name, request.key, request.offset, request.byte_size, peer_credentials(context)
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @answers_errors
    async def SystemSharedMemoryUnregister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        await self._shared_memory.unregister(SharedMemoryKind.SYSTEM, request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @answers_errors
    async def CudaSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        regions = self._shared_memory.status(SharedMemoryKind.CUDA, request.name)
        return pb.CudaSharedMemoryStatusResponse(
            regions={
                r.name: pb.CudaSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, device_id=r.device_id, byte_size=r.byte_size
                )
                for r in regions
            }
        )

    @answers_errors
    async def CudaSharedMemoryRegister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        await self._shared_memory.register_cuda(
            request.name, request.raw_handle, request.device_id, request.byte_size
        )
        return pb.CudaSharedMemoryRegisterResponse()

    @answers_errors
    async def CudaSharedMemoryUnregister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        await self._shared_memory.unregister(SharedMemoryKind.CUDA, request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    @answers_errors
    async def TraceSetting(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Triton's trace settings, global or of one model (``TraceSettings``)."""
        model = request.model_name
        if model and not self._dataplane.ready(model, ""):
            raise InvalidArgument(f"Request for unknown model : {model}")  # Triton's words
        changes = codec.trace_settings(request.settings)
        current = self._telemetry.trace_settings.update(model, changes)
        if changes and self._settings_changed is not None:
            self._settings_changed()  # the core samples by the new rules
        return codec.encode_trace_settings(current)

    @answers_errors
    async def LogSettings(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        current = apply_log_settings(
            self._telemetry.log_control, codec.parameters(request.settings)
        )
        if self._settings_changed is not None:
            self._settings_changed()
        return codec.encode_log_settings(current)


# The methods whose messages the core parses and writes itself: grpc hands them over as bytes.
_BYTES_METHODS = frozenset({"ModelInfer"})
# The core server's alone: it forwards a stream's requests here one by one, as ModelInfer.
_CORE_ONLY_METHODS = frozenset({"ModelStreamInfer"})


def add_inference_service(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Registers ``inference.GRPCInferenceService`` on ``server``: every method of the proto's
    service but ModelStreamInfer, with protobuf (de)serialization except for ModelInfer, which
    takes and returns serialized bytes."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        if method.name in _CORE_ONLY_METHODS:
            continue
        raw = method.name in _BYTES_METHODS
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        make = (
            grpc.stream_stream_rpc_method_handler
            if method.client_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=None if raw else request_type.FromString,
            response_serializer=None if raw else response_type.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
