"""The composition root: settings -> repository -> models and schedulers -> gRPC server.

``create_server`` builds a server and binds its port; ``start`` and ``stop`` run it. Tests and the
CLI use the same path.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

import inferd._proto.grpc_service_pb2 as grpc_service_pb2
import inferd._proto.grpc_service_pb2_grpc as grpc_service_pb2_grpc
from inferd._proto import POOL
from inferd.batching import CompletionDispatcher, HostBufferPool
from inferd.dataplane import DataPlane
from inferd.executors import OnnxRuntimeOptions
from inferd.executors.onnxruntime import default_intra_op_threads
from inferd.models import ModelRegistry
from inferd.models.control import ControlMode, ModelControl
from inferd.repository import ModelRepository
from inferd.settings import ServerSettings
from inferd.transport.servicer import InferenceServicer, ServerState

log = structlog.get_logger(__name__)

SERVICE_NAME = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name


@dataclass
class InferenceServer:
    """A built server: its gRPC server, bound port, models and health."""

    settings: ServerSettings
    grpc_server: grpc.aio.Server
    port: int
    registry: ModelRegistry
    control: ModelControl
    dispatcher: CompletionDispatcher
    pool: HostBufferPool
    health: health.aio.HealthServicer
    state: ServerState
    _poller: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.grpc_server.start()
        self.state.accepting = True
        if self.control.mode is ControlMode.POLL:
            self._poller = asyncio.create_task(
                self.control.poll_forever(self.settings.repository_poll_secs)
            )
        # "" is the process (liveness: up and taking calls); the inference service is readiness:
        # every model that should have loaded has, as ServerReady reports.
        ready = self.registry.all_ready()
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        await self.health.set("", serving)
        await self.health.set(SERVICE_NAME, serving if ready else not_serving)
        log.info("server started", port=self.port, ready=ready, models=len(self.registry.loaded()))

    async def stop(self, grace: float | None = None) -> None:
        """Stops taking calls, lets in-flight ones finish within ``grace`` seconds, then drains
        the models' queues and frees them."""
        grace = self.settings.exit_timeout_secs if grace is None else grace
        self.state.accepting = False
        if self._poller is not None:
            self._poller.cancel()
        await self.health.enter_graceful_shutdown()
        await self.grpc_server.stop(grace)
        await self.registry.close()
        self.dispatcher.close()
        # allocations stays at its warm-up count under steady traffic: batches reuse buffers.
        log.info("server stopped", batch_buffer_pool=self.pool.stats())


def _ort_defaults(settings: ServerSettings) -> OnnxRuntimeOptions:
    return OnnxRuntimeOptions(
        intra_op_thread_count=settings.intra_op_thread_count or default_intra_op_threads(),
        inter_op_thread_count=settings.inter_op_thread_count,
    )


async def create_server(settings: ServerSettings) -> InferenceServer:
    """Loads the repository's models and binds the gRPC port. Must run on the loop that will
    serve: the core's completions are delivered to it."""
    loop = asyncio.get_running_loop()
    dispatcher = CompletionDispatcher(loop)
    pool = HostBufferPool(settings.pinned_memory_pool_byte_size)
    log.info(
        "batch buffer pool",
        bytes=settings.pinned_memory_pool_byte_size,
        pinned=pool.stats()["pinned"],
        cuda=HostBufferPool.cuda_runtime(),
    )
    repository = ModelRepository(settings.model_repository)
    registry = ModelRegistry(
        repository,
        dispatcher,
        pool,
        default_max_batch_size=settings.default_max_batch_size,
        onnxruntime_options=_ort_defaults(settings),
    )
    # Loading reads files and builds sessions: off the loop, which has nothing else to do yet.
    try:
        mode = ControlMode(settings.model_control_mode)
    except ValueError:
        raise ValueError(
            "--model-control-mode must be none, explicit or poll, "
            f"not {settings.model_control_mode!r}"
        ) from None
    control = ModelControl(registry, repository, mode)
    startup = control.startup_models(
        [n.strip() for n in settings.load_model.split(",") if n.strip()]
    )
    await loop.run_in_executor(None, registry.load_all, startup)
    if mode is ControlMode.POLL:
        await loop.run_in_executor(None, control.remember_repository)

    options = [
        ("grpc.max_send_message_length", settings.grpc_max_message_bytes),
        ("grpc.max_receive_message_length", settings.grpc_max_message_bytes),
    ]
    server = grpc.aio.server(options=options)
    state = ServerState()
    grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        InferenceServicer(DataPlane(registry), control, state), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    # Reflection describes services from inferd's private descriptor pool (see inferd._proto),
    # which therefore also gets the health and reflection files.
    for module in (health_pb2, reflection_pb2):
        try:
            POOL.FindFileByName(module.DESCRIPTOR.name)
        except KeyError:
            POOL.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    reflection.enable_server_reflection(
        [SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], server, pool=POOL
    )
    port = server.add_insecure_port(f"{settings.host}:{settings.grpc_port}")
    if port == 0:
        raise OSError(f"cannot bind gRPC to {settings.host}:{settings.grpc_port}")
    if settings.grpc_unix_socket:
        server.add_insecure_port(f"unix:{settings.grpc_unix_socket}")
    return InferenceServer(
        settings, server, port, registry, control, dispatcher, pool, health_servicer, state
    )
