"""The composition root: settings -> repository -> models and schedulers -> gRPC server, with
telemetry (traces, metrics, logs) and health around them.

Clients connect to the core's gRPC server (grpc++, ``transport.core_server``), which runs inference
itself and forwards every other call to the Python gRPC service (servicer, health, reflection),
served by grpc.aio on a private Unix socket.

``create_server`` builds a server and binds its port; ``start`` and ``stop`` run it. Tests and the
CLI use the same path.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace.export import SpanExporter

import inferd._proto.grpc_service_pb2 as grpc_service_pb2
from inferd._proto import POOL
from inferd.core import (
    CompletionDispatcher,
    EnsembleScheduler,
    HostBufferPool,
    ModelCalls,
    cuda_runtime_description,
    response_cache,
)
from inferd.dataplane import DataPlane
from inferd.executors import OnnxRuntimeOptions
from inferd.executors.onnxruntime import default_intra_op_threads
from inferd.models import LoadedModel, ModelRegistry, ReadinessRules
from inferd.models.builder import LoadLimits
from inferd.models.control import ControlMode, ModelControl
from inferd.models.registry import ModelState
from inferd.models.warmup import WarmupLimits
from inferd.observability.logging import LogControl
from inferd.observability.metrics import InferenceMetrics
from inferd.observability.model_counters import EnsembleStepCounters, ModelCounters
from inferd.observability.open_files import OpenFilesWatch
from inferd.observability.telemetry import Telemetry
from inferd.observability.tracing import create_tracer_provider
from inferd.repository import ModelRepository, sequence_state_memory
from inferd.settings import ServerSettings
from inferd.shared_memory import SharedMemory
from inferd.transport.bls import DataPlaneModelCaller
from inferd.transport.core_server import (
    BackendSocket,
    CoreGrpcServer,
    MalformedRequestsAreInvalid,
    ObservationReader,
    PublicUnixSocket,
    ServingPublisher,
)
from inferd.transport.health import DrainingHealthServicer, HealthReporter
from inferd.transport.http_server import CoreHttpServer
from inferd.transport.listeners import Listeners, bind_transport, check_ports_free, http_host
from inferd.transport.reflection import enable_reflection
from inferd.transport.servicer import InferenceServicer, ServerState, add_inference_service

log = structlog.get_logger(__name__)

SERVICE_NAME = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name


@dataclass
class InferenceServer:
    """A built server: the core's gRPC server and its bound port (None: no TCP listener), the
    Python service behind it (on a private socket), models and health."""

    settings: ServerSettings
    transport: CoreGrpcServer
    publisher: ServingPublisher
    backend: grpc.aio.Server
    backend_socket: BackendSocket
    port: int | None
    registry: ModelRegistry
    control: ModelControl
    dispatcher: CompletionDispatcher
    pool: HostBufferPool
    health: HealthReporter
    state: ServerState
    telemetry: Telemetry
    metrics_port: int | None = None
    unix_socket: PublicUnixSocket | None = None
    observations: ObservationReader | None = None
    # The core's HTTP server (None: no HTTP listener), its TCP port and Unix socket.
    http: CoreHttpServer | None = None
    http_port: int | None = None
    http_unix_socket: PublicUnixSocket | None = None
    _poller: asyncio.Task[None] | None = None
    _open_files: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.state.accepting = True
        self.publisher.publish()
        if self.control.mode is ControlMode.POLL:
            self._poller = asyncio.create_task(
                self.control.poll_forever(self.settings.repository_poll_secs)
            )
        await self.health.update()
        self.health.start()
        self._open_files = asyncio.create_task(OpenFilesWatch().run())
        log.info(
            "server started",
            listeners=self.listeners(),
            port=self.port,
            http_port=self.http_port,
            metrics_port=self.metrics_port,
            tracing=self.telemetry.tracer is not None,
            ready=self.registry.server_ready(),
            models=len(self.registry.loaded()),
            models_loaded=sorted({m.name for m in self.registry.loaded()}),
            models_failed=self.failed_models(),
        )

    def failed_models(self) -> list[str]:
        """The models whose load was tried and failed, no version of them serving (sorted)."""
        loaded = {m.name for m in self.registry.loaded()}
        # Only models a load was tried for: in explicit mode the rest were never asked for.
        tried = set(self.registry.known_models())
        return sorted(
            {
                s.name
                for s in self.registry.index()
                if s.state is ModelState.UNAVAILABLE and s.name in tried and s.name not in loaded
            }
        )

    def listeners(self) -> list[str]:
        """Where clients reach the server: gRPC's TCP address and Unix socket, HTTP's URL and
        Unix socket, metrics' URL."""
        host = self.settings.host
        found = [] if self.port is None else [f"{host}:{self.port}"]
        if self.unix_socket is not None:
            found.append(f"unix:{self.unix_socket.path}")
        if self.http_port is not None:
            found.append(f"http://{http_host(self.settings)}:{self.http_port}")
        if self.http_unix_socket is not None:
            found.append(f"http+unix:{self.http_unix_socket.path}")
        if self.metrics_port is not None:
            found.append(f"http://{host}:{self.metrics_port}/metrics")
        return found

    async def stop(self, grace: float | None = None) -> None:
        """Stops taking calls, lets in-flight ones finish within ``grace`` seconds, then drains
        the models' queues and frees them."""
        grace = self.settings.exit_timeout_secs if grace is None else grace
        deadline = time.monotonic() + grace  # for everything in flight, not per stage
        self.registry.abandon_loads()  # a load or warm-up in progress must not hold the stop
        self.state.accepting = False
        self.publisher.publish()
        await self.health.shut_down()  # first: load balancers stop sending before the drain
        if self._poller is not None:
            self._poller.cancel()
        if self._open_files is not None:
            self._open_files.cancel()
        # The core's servers forward calls to the Python service until their last call is done:
        # the loop keeps answering them while the core's shutdown waits on another thread. HTTP
        # first: it forwards through the gRPC server's channel.
        loop = asyncio.get_running_loop()
        if self.http is not None:
            await loop.run_in_executor(None, self.http.shutdown, grace)
        await loop.run_in_executor(None, self.transport.shutdown, grace)
        if self.observations is not None:
            self.observations.close()  # the last calls' records, before the exporter stops
        await self.backend.stop(None)
        self.backend_socket.remove()
        for unix_socket in (self.unix_socket, self.http_unix_socket):
            if unix_socket is not None:
                unix_socket.remove()
        # A python model's execute that never returns must not hold the stop forever. At least
        # a second (within the exit margin): batches that are ending, and finalize, still run.
        await self.registry.close(abort_after_s=max(deadline - time.monotonic(), 1.0))
        self.dispatcher.close()
        self.telemetry.close()
        # allocations stays at its warm-up count under steady traffic: batches reuse buffers.
        log.info("server stopped", batch_buffer_pool=self.pool.stats())


def _ort_defaults(settings: ServerSettings) -> OnnxRuntimeOptions:
    return OnnxRuntimeOptions(
        intra_op_thread_count=settings.intra_op_thread_count or default_intra_op_threads(),
        inter_op_thread_count=settings.inter_op_thread_count,
    )


def _load_limits(settings: ServerSettings) -> LoadLimits:
    return LoadLimits(
        max_instance_count=settings.max_instance_count,
        warmup=WarmupLimits(
            max_count=settings.max_warmup_count,
            max_bytes=settings.max_warmup_bytes,
            timeout_s=settings.warmup_timeout_secs,
        ),
    )


def _model_counters(registry: ModelRegistry) -> list[ModelCounters]:
    return [
        ModelCounters(
            m.name,
            str(m.version),
            m.scheduler.statistics(),
            m.scheduler.pending_requests(),
            _ensemble_steps(m),
            m.scheduler.sequence_counts(),
        )
        for m in registry.published()
    ]


def _ensemble_steps(model: LoadedModel) -> tuple[EnsembleStepCounters, ...]:
    """An ensemble version's steps' counters, in its config's order; none for a model."""
    if not isinstance(model.scheduler, EnsembleScheduler):
        return ()
    return tuple(
        EnsembleStepCounters(index, step_model, statistics)
        for index, ((step_model, _), statistics) in enumerate(
            zip(model.composing, model.scheduler.step_statistics(), strict=True)
        )
    )


@dataclass
class _Models:
    """What serves inference, built and loaded before any listener binds."""

    dispatcher: CompletionDispatcher
    pool: HostBufferPool
    registry: ModelRegistry
    control: ModelControl
    dataplane: DataPlane
    metrics: InferenceMetrics | None
    calls: ModelCalls


async def _load_models(settings: ServerSettings, stopping: threading.Event | None) -> _Models:
    """The schedulers' shared pieces, the registry with the startup models loaded (off the loop,
    which has nothing else to do yet: loading reads files and builds sessions), the data plane
    and the control plane."""
    loop = asyncio.get_running_loop()
    dispatcher = CompletionDispatcher(loop)
    pool = HostBufferPool(settings.pinned_memory_pool_byte_size)
    log.info(
        "batch buffer pool",
        bytes=settings.pinned_memory_pool_byte_size,
        pinned=pool.stats()["pinned"],
        cuda=cuda_runtime_description(),
    )
    repository = ModelRepository(settings.model_repository)
    state_memory = sequence_state_memory(settings.max_sequence_state_bytes)
    cache = response_cache(settings.cache_config)
    registry = ModelRegistry(
        repository,
        dispatcher,
        pool,
        default_max_batch_size=settings.default_max_batch_size,
        onnxruntime_options=_ort_defaults(settings),
        limits=_load_limits(settings),
        abandon=stopping,
        readiness=ReadinessRules(settings.strict_readiness, settings.ready_without_models),
        drain_timeout_s=settings.exit_timeout_secs,
        state_memory=state_memory,
        response_cache=cache,
    )
    # Before the first load: a failed one is counted, and each loaded version's failure series
    # are there from its load.
    metrics = (
        None
        if settings.metrics_port < 0
        else InferenceMetrics(
            lambda: _model_counters(registry),
            loaded=lambda: [(m.name, str(m.version)) for m in registry.published()],
            state_memory=state_memory,
            response_cache=cache,
        )
    )
    if metrics is not None:
        registry.add_load_failure_listener(metrics.load_failed)
    dataplane = DataPlane(registry)
    # Python models call other models (BLS) through the data plane, as clients' requests go,
    # and their worker restarts make them not ready.
    # The core routes them once its server serves (serve_model_calls); Python, what it cannot.
    calls = ModelCalls()
    registry.serve_python_models(DataPlaneModelCaller(dataplane, loop), loop, calls)
    try:
        mode = ControlMode(settings.model_control_mode)
    except ValueError:
        raise ValueError(
            "--model-control-mode must be none, explicit or poll, "
            f"not {settings.model_control_mode!r}"
        ) from None
    control = ModelControl(
        registry,
        repository,
        mode,
        max_config_override_bytes=settings.max_config_override_bytes,
    )
    startup = control.startup_models(
        [n.strip() for n in settings.load_model.split(",") if n.strip()]
    )
    await loop.run_in_executor(None, registry.load_all, startup)
    if mode is ControlMode.POLL:
        await loop.run_in_executor(None, control.remember_repository)
    return _Models(dispatcher, pool, registry, control, dataplane, metrics, calls)


def _add_services(
    backend: grpc.aio.Server, servicer: InferenceServicer, models: _Models, state: ServerState
) -> HealthReporter:
    """The Python service's services: inference (what the core forwards), health and
    reflection. Returns the health reporter, which follows the registry."""
    add_inference_service(servicer, backend)
    health_servicer = DrainingHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, backend)
    reporter = HealthReporter(health_servicer, models.dataplane, state, SERVICE_NAME)
    models.registry.add_listener(reporter.changed)
    # Reflection describes services from inferd's private descriptor pool (see inferd._proto),
    # which therefore also gets the health file.
    try:
        POOL.FindFileByName(health_pb2.DESCRIPTOR.name)
    except KeyError:
        POOL.AddSerializedFile(health_pb2.DESCRIPTOR.serialized_pb)
    enable_reflection(backend, [SERVICE_NAME, health.SERVICE_NAME], POOL)
    return reporter


async def create_server(
    settings: ServerSettings,
    *,
    log_control: LogControl | None = None,
    span_exporter: SpanExporter | None = None,
    stopping: threading.Event | None = None,
) -> InferenceServer:
    """Loads the repository's models and binds the gRPC and metrics ports. Must run on the loop
    that will serve: the core's completions are delivered to it. ``log_control``: the one
    ``configure_logging`` returned (default: a fresh one from the settings); ``span_exporter``
    replaces OTLP and turns tracing on (tests); ``stopping``, once set (by a signal handler, on
    any thread), stops the loads in progress at their next step."""
    # First, before any model loads: a port in use or a bad limit fails the start at once.
    check_ports_free(settings)
    # The process's one registry of client regions: the control calls change it, the core's server
    # and the data plane read requests' regions from it.
    shared_memory = SharedMemory(
        settings.shared_memory,
        max_regions=settings.shared_memory_max_regions,
        max_bytes=settings.shared_memory_max_bytes,
    )
    models = await _load_models(settings, stopping)
    telemetry = Telemetry(
        log_control or LogControl(settings.log_level, settings.log_verbose, settings.log_format),
        models.metrics,
        create_tracer_provider(settings.trace_config, exporter=span_exporter),
    )
    # The Python service: only the core's server reaches it, after applying the caller's limits.
    backend = grpc.aio.server(
        options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
        interceptors=[MalformedRequestsAreInvalid()],
    )
    listeners = bind_transport(settings, backend, shared_memory)
    listeners.transport.serve_model_calls(models.calls)
    state = ServerState()
    publisher = ServingPublisher(listeners.transport, models.dataplane, state, telemetry)
    models.registry.add_listener(publisher.publish)
    models.registry.add_settler(listeners.transport.settle)
    servicer = InferenceServicer(
        models.dataplane,
        models.control,
        state,
        telemetry,
        publisher.publish,
        shared_memory=shared_memory,
    )
    reporter = _add_services(backend, servicer, models, state)
    await backend.start()
    if models.metrics is not None:
        models.metrics.failures.add_source(listeners.transport.failures)
    try:
        metrics_port = (
            None
            if models.metrics is None
            else models.metrics.serve(settings.host, settings.metrics_port)
        )
    except OSError as e:
        listeners.shutdown(0)
        await backend.stop(None)
        listeners.remove()
        raise OSError(
            f"cannot serve metrics on {settings.host}:{settings.metrics_port} "
            f"(--metrics-port): {e.strerror or e}"
        ) from None
    return InferenceServer(
        settings,
        listeners.transport,
        publisher,
        backend,
        listeners.backend_socket,
        None if settings.grpc_port < 0 or not settings.allow_grpc else listeners.transport.ports[0],
        models.registry,
        models.control,
        models.dispatcher,
        models.pool,
        reporter,
        state,
        telemetry,
        metrics_port,
        listeners.unix_socket,
        ObservationReader(listeners.transport.observations, telemetry, asyncio.get_running_loop()),
        listeners.http,
        _http_port(settings, listeners),
        listeners.http_unix_socket,
    )


def _http_port(settings: ServerSettings, listeners: Listeners) -> int | None:
    """The HTTP TCP listener's bound port (None: none)."""
    if listeners.http is None or settings.http_port < 0:
        return None
    return listeners.http.ports[0]
