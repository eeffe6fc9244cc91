"""``inference.GRPCInferenceService``: each handler decodes, calls the data plane, encodes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

import inferd._proto.grpc_service_pb2 as pb
import inferd._proto.grpc_service_pb2_grpc as grpc_service_pb2_grpc
from inferd import __version__
from inferd.batching import WireRequest, stream_error_response
from inferd.dataplane import DataPlane
from inferd.errors import InferdError
from inferd.models.control import ModelControl
from inferd.observability.logging import apply_log_settings
from inferd.observability.telemetry import Telemetry
from inferd.transport import codec
from inferd.transport.status import answers_errors, grpc_status

# Protocol extensions inferd implements (ServerMetadata.extensions); perf_analyzer reads
# ModelStatistics only when "statistics" is listed.
EXTENSIONS = ["model_configuration", "model_repository", "statistics", "schedule_policy"]


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
    ) -> None:
        self._dataplane = dataplane
        self._control = control
        self._state = state
        self._telemetry = telemetry

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerLiveResponse(live=self._state.live)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        ready = self._state.accepting and self._dataplane.registry.all_ready()
        return pb.ServerReadyResponse(ready=ready)

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            self._dataplane.registry.get(request.name, request.version)
        except InferdError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self._state.accepting)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerMetadataResponse(name="inferd", version=__version__, extensions=EXTENSIONS)

    @answers_errors
    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        model, versions = self._dataplane.metadata(request.name, request.version)
        return codec.encode_model_metadata(model, versions)

    @answers_errors
    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        model = self._dataplane.registry.get(request.name, request.version)
        return pb.ModelConfigResponse(config=model.config)

    @answers_errors
    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return codec.encode_model_statistics(
            self._dataplane.statistics(request.name, request.version)
        )

    @answers_errors
    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return codec.encode_repository_index(self._dataplane.registry.index(), request.ready)

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
        """Bytes in, bytes out: the core parses the request and writes the answer."""
        return await self._infer(self._dataplane.parse(request), context, None, stream=False)

    async def _infer(
        self,
        request: WireRequest,
        context: grpc.aio.ServicerContext,
        metadata: Any | None,
        stream: bool,
    ) -> bytes:
        """One parsed request -> its serialized answer. Observed (span, failure count, log line)
        only when tracing or verbose logging asks for it; otherwise only failures are counted.
        ``metadata``: the call's, when already read (streams); read here only if observed."""
        deadline_s = context.time_remaining()
        if not self._telemetry.observes_each_request:
            return await self._dataplane.infer(
                request, deadline_s=deadline_s, stream=stream, on_failure=self._telemetry.failed
            )
        if metadata is None:
            metadata = context.invocation_metadata()
        with self._telemetry.request(request.model_name, metadata) as observed:
            return await self._dataplane.infer(
                request, deadline_s=deadline_s, stream=stream, observed=observed
            )

    @answers_errors
    async def LogSettings(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        current = apply_log_settings(self._telemetry.log_control, codec.log_settings(request))
        return codec.encode_log_settings(current)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Answers each request as it completes, not in arrival order. A failed request, or a
        message that is not a ModelInferRequest, is answered in ``error_message`` (with the
        request's id when it has one) and the stream goes on, unless the client sent the
        ``triton_grpc_error: true`` header (Triton's opt-in): then the call ends with the status."""
        metadata_pairs = context.invocation_metadata()
        metadata = dict(metadata_pairs or ())
        end_on_error = str(metadata.get("triton_grpc_error", "")).lower() == "true"
        answers: asyncio.Queue[bytes | tuple[BaseException, str] | None] = asyncio.Queue()

        async def answer(data: bytes) -> None:
            request_id = ""
            try:
                request = self._dataplane.parse(data)
                request_id = request.id
                answers.put_nowait(await self._infer(request, context, metadata_pairs, stream=True))
            except Exception as e:
                answers.put_nowait((e, request_id))

        tasks: set[asyncio.Task[None]] = set()

        async def read_all() -> None:
            try:
                async for data in requests:
                    task = asyncio.create_task(answer(data))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if tasks:
                    await asyncio.gather(*tasks)
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read_all())
        try:
            while (item := await answers.get()) is not None:
                if isinstance(item, tuple):
                    error, request_id = item
                    code, message = grpc_status(error)
                    if end_on_error:
                        await context.abort(code, message)
                    # Answers come in completion order: as Triton does, the error carries the
                    # failed request's id, so that the client knows which request failed.
                    yield stream_error_response(message, request_id)
                else:
                    yield item
        finally:
            # The stream ended (or the client went away): nothing still queued is computed.
            reader.cancel()
            for task in tasks:
                task.cancel()


# The methods whose messages the core parses and writes itself: grpc hands them over as bytes.
_BYTES_METHODS = frozenset({"ModelInfer", "ModelStreamInfer"})


def add_inference_service(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Registers ``inference.GRPCInferenceService`` on ``server``: every method of the proto's
    service, with protobuf (de)serialization except for the inference methods, which take and
    return serialized bytes."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
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
