"""The core's gRPC server, which clients connect to, and what it needs from Python.

The core (grpc++, ``cpp/src/grpc_server.cpp``) serves the public port and Unix socket. It runs
ModelInfer and ModelStreamInfer itself, and answers ServerLive/Ready, ModelReady, ModelMetadata and
ModelConfig from a snapshot of the Python side's state. Every other call, and every call the
snapshot does not cover, goes unparsed to inferd's Python gRPC service (``servicer.py``) on a
private Unix socket, the backend. ``ServingPublisher`` keeps the snapshot equal to what the Python
service would answer: it is rebuilt with the service's own code on every change. The inferences
the core runs while Python observes them (sampled for tracing, verbose logs) come back as records,
which ``ObservationReader`` hands the telemetry.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import inspect
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc
import structlog
from google.protobuf.message import DecodeError

import inferd._proto.grpc_service_pb2 as pb
from inferd.core import (
    GrpcServer,
    ModelCalls,
    ObservationQueue,
    SharedMemoryRegistry,
    TraceSampling,
)
from inferd.dataplane import DataPlane
from inferd.errors import ErrorCode
from inferd.observability.telemetry import Telemetry
from inferd.observability.tracing import SamplingRule
from inferd.transport import codec
from inferd.transport.servicer import ServerState

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class TransportOptions:
    """How the core's server listens (see ``inferd.settings`` for each)."""

    addresses: list[str]
    max_message_bytes: int
    keepalive_time_ms: int = 0
    keepalive_timeout_ms: int = 0
    max_concurrent_streams: int = 0
    max_connection_idle_ms: int = 0
    use_ssl: bool = False
    use_ssl_mutual: bool = False
    server_cert_pem: str = ""
    server_key_pem: str = ""
    root_cert_pem: str = ""
    # (groups, key, value) of each --grpc-restricted-protocol (see restricted_protocol).
    restricted_protocols: tuple[tuple[list[str], str, str], ...] = ()
    control_on_tcp: bool = False
    max_stream_outstanding: int = 1024
    max_stream_pending_bytes: int = 64 << 20
    max_inflight_bytes: int = 0
    # The server's regions (None: shared memory off), served on the Unix socket, and on TCP too
    # with shared_memory_on_tcp (--shared-memory-listeners all).
    shared_memory: SharedMemoryRegistry | None = None
    shared_memory_on_tcp: bool = False


def restricted_protocol(spec: str) -> tuple[list[str], str, str]:
    """``GROUPS:KEY=VALUE`` (Triton's --grpc-restricted-protocol) as (groups, key, value). So that
    the secret need not be on the command line, VALUE ``@PATH`` is the first line of the file at
    PATH and ``env:NAME`` the value of the environment variable NAME. The core checks the groups
    and the header's characters. Raises ValueError naming what is wrong (never the value)."""
    groups, colon, header = spec.partition(":")
    key, equals, value = header.partition("=")
    if not colon or not equals or not groups or not key:
        raise ValueError(
            f"--grpc-restricted-protocol wants GROUPS:KEY=VALUE, got {spec.split('=')[0]}=..."
        )
    if value.startswith("@"):
        try:
            lines = Path(value[1:]).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise ValueError(
                f"--grpc-restricted-protocol {key}: cannot read {e.filename}"
            ) from None
        value = lines[0] if lines else ""
    elif value.startswith("env:"):
        name = value[len("env:") :]
        if name not in os.environ:
            raise ValueError(
                f"--grpc-restricted-protocol {key}: the environment variable {name} is not set"
            )
        value = os.environ[name]
    return [g.strip() for g in groups.split(",")], key, value


class MalformedRequestsAreInvalid(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Bytes that do not parse as a call's request message answer INVALID_ARGUMENT, on every
    service of the Python server (grpc answers UNKNOWN naming the decoder's exception class
    otherwise). Each handler is given the raw bytes and decodes them itself, inside the call."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        decode = None if handler is None else handler.request_deserializer
        if decode is None:
            return handler
        method = str(details.method)

        async def decoded(request: bytes, context: grpc.aio.ServicerContext) -> Any:
            try:
                return decode(request)
            except DecodeError:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the request of {method} is not a valid protobuf message",
                )

        async def requests(
            stream: AsyncIterator[bytes], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            async for request in stream:
                yield await decoded(request, context)

        serialize = handler.response_serializer
        if handler.unary_unary is not None:
            unary_unary = handler.unary_unary

            async def unary(request: bytes, context: grpc.aio.ServicerContext) -> Any:
                return await unary_unary(await decoded(request, context), context)

            return grpc.unary_unary_rpc_method_handler(unary, response_serializer=serialize)
        # A streaming handler is either a coroutine function writing with context.write or an
        # async generator function, and grpc.aio tells them apart by the function: the wrapper
        # must be of the same kind.
        if handler.unary_stream is not None:
            unary_stream = handler.unary_stream
            if inspect.iscoroutinefunction(unary_stream):

                async def to_writer(request: bytes, context: grpc.aio.ServicerContext) -> None:
                    await unary_stream(await decoded(request, context), context)

                return grpc.unary_stream_rpc_method_handler(
                    to_writer, response_serializer=serialize
                )

            async def to_stream(request: bytes, context: grpc.aio.ServicerContext) -> Any:
                async for response in unary_stream(await decoded(request, context), context):
                    yield response

            return grpc.unary_stream_rpc_method_handler(to_stream, response_serializer=serialize)
        if handler.stream_unary is not None:
            stream_unary = handler.stream_unary

            async def from_stream(stream: AsyncIterator[bytes], context: Any) -> Any:
                return await stream_unary(requests(stream, context), context)

            return grpc.stream_unary_rpc_method_handler(from_stream, response_serializer=serialize)
        stream_stream = handler.stream_stream
        if inspect.iscoroutinefunction(stream_stream):

            async def both_writer(
                stream: AsyncIterator[bytes], context: grpc.aio.ServicerContext
            ) -> None:
                await stream_stream(requests(stream, context), context)

            return grpc.stream_stream_rpc_method_handler(both_writer, response_serializer=serialize)

        async def both(stream: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
            async for response in stream_stream(requests(stream, context), context):
                yield response

        return grpc.stream_stream_rpc_method_handler(both, response_serializer=serialize)


class BackendSocket:
    """A private Unix socket for the Python gRPC service, in a folder only this user can enter."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="inferd-backend-"))  # mode 0700
        self.address = f"unix:{self._dir / 'grpc.sock'}"

    def remove(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


class PublicUnixSocket:
    """--grpc-unix-socket (or --http-unix-socket) with the file mode and group asked for, and no
    moment without them: the core creates the socket in a folder beside PATH that only this user
    can enter, ``publish`` sets its mode and group there and renames it to PATH (replacing a stale
    socket at once)."""

    def __init__(self, path: str, mode: int, group: str, protocol: str = "gRPC") -> None:
        self.path = Path(path)
        self._protocol = protocol
        self._mode = mode
        self._gid = _group_id(group) if group else -1  # -1: os.chown leaves the group
        # Same folder: a rename cannot cross file systems. Short names: socket paths have a
        # 107-byte limit.
        try:
            self._dir = Path(tempfile.mkdtemp(prefix=".inferd-", dir=self.path.parent))
        except OSError as e:
            raise OSError(
                f"cannot serve {protocol} on unix:{self.path}: {e.strerror or e}"
            ) from None
        self._staged = self._dir / "s"
        self.bind_address = f"unix:{self._staged}"
        self._inode: int | None = None

    def publish(self) -> None:
        """After grpc has bound ``bind_address``. Raises OSError naming PATH."""
        try:
            os.chmod(self._staged, self._mode)
            os.chown(self._staged, -1, self._gid)
            os.replace(self._staged, self.path)
            self._inode = self.path.stat().st_ino
        except OSError as e:
            self.remove()
            raise OSError(
                f"cannot serve {self._protocol} on unix:{self.path}: {e.strerror or e}"
            ) from None
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def remove(self) -> None:
        """Removes the socket file, unless another server has put its own at PATH since."""
        shutil.rmtree(self._dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            if self._inode is not None and self.path.stat().st_ino == self._inode:
                self.path.unlink()


def _group_id(group: str) -> int:
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"--grpc-unix-socket-group {group}: no such group") from None


# The most a version that stopped being routed to waits for calls still submitting to it.
SETTLE_TIMEOUT_S: Final = 1.0


class CoreGrpcServer:
    """The core's gRPC server: binds on construction, serves until ``shutdown``."""

    def __init__(self, options: TransportOptions, backend_address: str) -> None:
        try:
            self._server = GrpcServer(
                options.addresses,
                backend_address,
                options.max_message_bytes,
                keepalive_time_ms=options.keepalive_time_ms,
                keepalive_timeout_ms=options.keepalive_timeout_ms,
                max_concurrent_streams=options.max_concurrent_streams,
                use_ssl=options.use_ssl,
                use_ssl_mutual=options.use_ssl_mutual,
                server_cert_pem=options.server_cert_pem,
                server_key_pem=options.server_key_pem,
                root_cert_pem=options.root_cert_pem,
                max_connection_idle_ms=options.max_connection_idle_ms,
                restricted_protocols=list(options.restricted_protocols),
                control_on_tcp=options.control_on_tcp,
                max_stream_outstanding=options.max_stream_outstanding,
                max_stream_pending_bytes=options.max_stream_pending_bytes,
                max_inflight_bytes=options.max_inflight_bytes,
                shared_memory=options.shared_memory,
                shared_memory_on_tcp=options.shared_memory_on_tcp,
            )
        except RuntimeError as e:
            raise OSError(str(e)) from None

    @property
    def ports(self) -> list[int]:
        """The bound port of each address (0 for a Unix socket)."""
        ports: list[int] = self._server.ports
        return ports

    @property
    def core(self) -> GrpcServer:
        """The core's server, which the HTTP server shares its snapshot and backend with."""
        return self._server

    def serve_model_calls(self, calls: ModelCalls) -> None:
        """Python models' calls (BLS) are routed by this server's serving snapshot from here
        on, as its clients' requests are."""
        self._server.serve_model_calls(calls)

    def publish(
        self,
        *,
        live: bool,
        ready: bool,
        accepting: bool,
        forward_inference: bool,
        tracing: SamplingRule | None,
        routes: list[tuple[Any, ...]],
        weights: list[tuple[str, list[tuple[str, int]]]],
        observe_inference: bool = False,
        model_tracing: dict[str, SamplingRule] | None = None,
    ) -> None:
        """``forward_inference``: every inference goes to Python; ``tracing`` (None: off): the
        inferences it samples are reported on ``observations``, and every one with
        ``observe_inference``; ``model_tracing``: the models sampled by a rule of their own
        instead; ``weights``: (model, [(version, weight)]) routing the inferences that name no
        version of that model."""
        self._server.publish(
            live,
            ready,
            accepting,
            forward_inference,
            _core_sampling(tracing),
            routes,
            weights,
            observe_inference,
            {model: _core_sampling(rule) for model, rule in (model_tracing or {}).items()},
        )

    def settle(self, timeout_s: float = SETTLE_TIMEOUT_S) -> bool:
        """Blocks until no call that routed a request by an earlier snapshot can still submit it
        (microseconds: a call holds its read only until it submits); False past ``timeout_s``.
        The registry waits for it before closing a version it stopped routing to. Run it off
        the event loop."""
        return bool(self._server.settle(int(timeout_s * 1000)))

    @property
    def observations(self) -> ObservationQueue:
        """The inferences the core ran while Python observes them."""
        return self._server.observations

    def failures(self) -> Iterator[tuple[str, str, ErrorCode, str, int]]:
        """Inference requests the core's transports failed, by model version, error code and
        protocol ("grpc" or "http")."""
        for model, version, code, protocol, count in self._server.failures():
            yield model, version, ErrorCode(code), protocol, count

    def shutdown(self, grace_s: float) -> None:
        """Blocks until every call is done: run it off the event loop, which answers some."""
        self._server.shutdown(grace_s)


def _core_sampling(rule: SamplingRule | None) -> TraceSampling:
    """The core's form of a sampling rule (None: off)."""
    if rule is None or rule.samples_nothing:
        return TraceSampling()
    return TraceSampling(True, rule.parent_based, rule.ratio, rule.budget)


class ServingPublisher:
    """Rebuilds the core server's snapshot from the data plane, the server's state and telemetry,
    with the servicer's own answers (``DataPlane.metadata``, ``codec``), so that a call answered
    from the snapshot gets exactly what the Python service would have answered. Used on the event
    loop's thread."""

    def __init__(
        self,
        server: CoreGrpcServer,
        dataplane: DataPlane,
        state: ServerState,
        telemetry: Telemetry,
    ) -> None:
        self._server = server
        self._dataplane = dataplane
        self._state = state
        self._telemetry = telemetry

    def publish(self) -> None:
        routes: list[tuple[Any, ...]] = []
        weights: list[tuple[str, list[tuple[str, int]]]] = []
        for name, ready_versions in self._dataplane.ready_versions().items():
            keys = [""] + [str(v) for v in ready_versions]
            version_weights = self._dataplane.version_weights(name)
            if version_weights:
                weights.append((name, [(str(v), w) for v, w in version_weights.items()]))
            elif version_weights is not None:
                keys = keys[1:]  # no weighted version ready: Python answers it is unavailable
            for key in keys:
                model, versions = self._dataplane.metadata(name, key)
                routes.append(
                    (
                        name,
                        key,
                        model.name,
                        str(model.version),
                        model.scheduler.core,
                        model.scheduler.signature,
                        codec.encode_model_metadata(model, versions).SerializeToString(),
                        pb.ModelConfigResponse(config=model.config).SerializeToString(),
                    )
                )
        self._server.publish(
            live=self._state.live,
            ready=self._state.accepting and self._dataplane.server_ready(),
            accepting=self._state.accepting,
            # Python sees every inference only while it traces by a rule the core lacks; otherwise
            # the core reports the ones it samples, and every one while Python logs each.
            forward_inference=self._telemetry.tracer is not None
            and self._telemetry.sampling is None,
            tracing=self._telemetry.sampling,
            routes=routes,
            weights=weights,
            observe_inference=self._telemetry.log_control.verbose > 0,
            model_tracing=self._telemetry.model_sampling,
        )


class ObservationReader:
    """Hands the telemetry each inference the core ran while Python observes it, on the event
    loop's thread, woken by the queue's eventfd: a burst of records costs one wake-up. The core
    never waits on it (a full queue drops records and counts them)."""

    def __init__(
        self,
        queue: ObservationQueue,
        telemetry: Telemetry,
        loop: asyncio.AbstractEventLoop,
        *,
        drops_every_s: float = 10.0,
    ) -> None:
        self._queue = queue
        self._telemetry = telemetry
        self._loop = loop
        # Drops are told at most once per drops_every_s, with the count since the last telling.
        self._drops_every_s = drops_every_s
        self._dropped = 0
        self._told_at = float("-inf")
        loop.add_reader(self._queue.fileno(), self.drain)

    def drain(self) -> None:
        for record in self._queue.drain():
            try:
                self._telemetry.observed(record)
            except Exception:  # a span or line lost must not stop the others
                log.exception("cannot report an observed inference", model=record.model)
        dropped = self._queue.dropped()
        now = time.monotonic()
        if dropped > self._dropped and now - self._told_at >= self._drops_every_s:
            log.warning(
                "observed inferences dropped: their spans and log lines were lost, Python could "
                "not keep up with the core",
                dropped=dropped - self._dropped,
                dropped_since_start=dropped,
            )
            self._dropped, self._told_at = dropped, now

    def close(self) -> None:
        """After the core's server has shut down: reports the last records, stops reading."""
        self._loop.remove_reader(self._queue.fileno())
        self.drain()
