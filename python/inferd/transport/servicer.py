"""``inference.GRPCInferenceService``: each handler decodes, calls the data plane, encodes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

import inferd._proto.grpc_service_pb2 as pb
import inferd._proto.grpc_service_pb2_grpc as grpc_service_pb2_grpc
from inferd import __version__
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
    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._infer(request, context, context.invocation_metadata())

    async def _infer(self, request: Any, context: grpc.aio.ServicerContext, metadata: Any) -> Any:
        """One ModelInferRequest -> its ModelInferResponse, observed (span, metrics, log)."""
        with self._telemetry.request(request.model_name, metadata) as observed:
            with observed.stage("decode"):
                decoded = codec.decode_infer_request(request)
            response = await self._dataplane.infer(
                decoded, deadline_s=context.time_remaining(), observed=observed
            )
            with observed.stage("encode"):
                return codec.encode_infer_response(response)

    @answers_errors
    async def LogSettings(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        current = apply_log_settings(self._telemetry.log_control, codec.log_settings(request))
        return codec.encode_log_settings(current)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """Answers each request as it completes, not in arrival order. A failed request is
        answered in ``error_message`` (its id in ``infer_response``) and the stream goes on,
        unless the client sent the ``triton_grpc_error: true`` header (Triton's opt-in): then the
        call ends with the status."""
        metadata_pairs = context.invocation_metadata()
        metadata = dict(metadata_pairs or ())
        end_on_error = str(metadata.get("triton_grpc_error", "")).lower() == "true"
        answers: asyncio.Queue[Any] = asyncio.Queue()

        async def answer(request: Any) -> None:
            try:
                encoded = await self._infer(request, context, metadata_pairs)
                await answers.put(pb.ModelStreamInferResponse(infer_response=encoded))
            except Exception as e:
                await answers.put((e, request.id))

        tasks: set[asyncio.Task[None]] = set()

        async def read_all() -> None:
            try:
                async for request in requests:
                    task = asyncio.create_task(answer(request))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if tasks:
                    await asyncio.gather(*tasks)
            finally:
                await answers.put(None)

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
                    yield pb.ModelStreamInferResponse(
                        error_message=message, infer_response=pb.ModelInferResponse(id=request_id)
                    )
                else:
                    yield item
        finally:
            # The stream ended (or the client went away): nothing still queued is computed.
            reader.cancel()
            for task in tasks:
                task.cancel()
