"""The core's listeners built from the settings: the ports checked before models load, the core's
gRPC and HTTP servers bound to the public addresses, and the sockets beside them (the Python
service's private one, the public Unix sockets)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import grpc

from inferd.settings import ServerSettings
from inferd.shared_memory import SharedMemory
from inferd.transport.core_server import (
    BackendSocket,
    CoreGrpcServer,
    PublicUnixSocket,
    TransportOptions,
    restricted_protocol,
)
from inferd.transport.http_server import CoreHttpServer, HttpOptions, thread_count


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8") if path else ""


def _tls_files(settings: ServerSettings) -> tuple[str, str, str]:
    try:
        return (
            _read(settings.grpc_server_cert),
            _read(settings.grpc_server_key),
            _read(settings.grpc_root_cert),
        )
    except OSError as e:
        raise OSError(f"cannot read a TLS file: {e}") from None


def _transport_options(
    settings: ServerSettings, unix_socket: PublicUnixSocket | None, shared_memory: SharedMemory
) -> TransportOptions:
    # A negative port (--grpc-port off): no TCP listener; --allow-grpc false: none at all.
    addresses = (
        [f"{settings.host}:{settings.grpc_port}"]
        if settings.allow_grpc and settings.grpc_port >= 0
        else []
    )
    if unix_socket is not None:
        addresses.append(unix_socket.bind_address)
    cert, key, root = _tls_files(settings)
    return TransportOptions(
        addresses=addresses,
        max_message_bytes=settings.grpc_max_message_bytes,
        keepalive_time_ms=int(settings.grpc_keepalive_time_secs * 1000),
        keepalive_timeout_ms=int(settings.grpc_keepalive_timeout_secs * 1000),
        max_concurrent_streams=settings.grpc_max_concurrent_streams,
        max_connection_idle_ms=int(settings.grpc_max_connection_idle_secs * 1000),
        use_ssl=settings.grpc_use_ssl,
        use_ssl_mutual=settings.grpc_use_ssl_mutual,
        server_cert_pem=cert,
        server_key_pem=key,
        root_cert_pem=root,
        restricted_protocols=tuple(
            restricted_protocol(spec) for spec in settings.grpc_restricted_protocol
        ),
        control_on_tcp=settings.grpc_control_on_tcp,
        max_stream_outstanding=settings.stream_max_outstanding,
        max_stream_pending_bytes=settings.stream_max_pending_bytes,
        max_inflight_bytes=settings.max_inflight_bytes,
        shared_memory=shared_memory.core if shared_memory.enabled else None,
        shared_memory_on_tcp=settings.shared_memory_listeners == "all",
    )


def http_host(settings: ServerSettings) -> str:
    """Where the HTTP port binds: --http-host, else --host."""
    return settings.http_host or settings.host


def _http_options(settings: ServerSettings, unix_socket: PublicUnixSocket | None) -> HttpOptions:
    addresses = [f"{http_host(settings)}:{settings.http_port}"] if settings.http_port >= 0 else []
    if unix_socket is not None:
        addresses.append(unix_socket.bind_address)
    cert, key, root = _tls_files(settings)
    return HttpOptions(
        addresses=addresses,
        threads=thread_count(settings.http_thread_count),
        header_timeout_ms=int(settings.http_header_timeout_secs * 1000),
        idle_timeout_ms=int(settings.http_idle_timeout_secs * 1000),
        max_connections=settings.http_max_connections,
        max_header_bytes=settings.http_max_header_bytes,
        max_body_bytes=settings.http_max_body_bytes,
        max_decompressed_bytes=settings.http_max_decompressed_bytes,
        max_json_depth=settings.http_max_json_depth,
        max_chunks=settings.http_max_chunks,
        # One TLS setting for the server's TCP listeners: HTTP's TLS is gRPC's.
        use_ssl=settings.grpc_use_ssl,
        use_ssl_mutual=settings.grpc_use_ssl_mutual,
        server_cert_pem=cert,
        server_key_pem=key,
        root_cert_pem=root,
        restricted_protocols=tuple(
            restricted_protocol(spec) for spec in settings.grpc_restricted_protocol
        ),
        control_on_tcp=settings.grpc_control_on_tcp,
    )


def serves_http(settings: ServerSettings) -> bool:
    """Whether the settings ask for any HTTP listener."""
    return settings.allow_http and (settings.http_port >= 0 or bool(settings.http_unix_socket))


def check_ports_free(settings: ServerSettings) -> None:
    """Raises OSError naming the flag when the gRPC, HTTP or metrics TCP port is taken, so that a
    start fails before loading models (which can take minutes) rather than after. Port 0 (any free
    one) and the ports turned off are not checked; the real bind later reports anything else."""
    grpc_port = settings.grpc_port if settings.allow_grpc else -1
    http_port = settings.http_port if serves_http(settings) else -1
    ports = (
        ("gRPC", "--grpc-port", settings.host, grpc_port),
        ("HTTP", "--http-port", http_host(settings), http_port),
        ("metrics", "--metrics-port", settings.host, settings.metrics_port),
    )
    for what, flag, host, port in ports:
        if port <= 0:
            continue
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise OSError(f"cannot serve {what} on {host}:{port} ({flag}): {e}") from None
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            # As the real listeners bind: a port another server listens on is refused even so.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as e:
                raise OSError(
                    f"cannot serve {what} on {host}:{port} ({flag}): {e.strerror or e}"
                ) from None


@dataclass
class Listeners:
    """The core's servers, bound to the public addresses, and the sockets beside them."""

    transport: CoreGrpcServer
    backend_socket: BackendSocket
    unix_socket: PublicUnixSocket | None
    http: CoreHttpServer | None = None
    http_unix_socket: PublicUnixSocket | None = None

    def shutdown(self, grace_s: float) -> None:
        """HTTP first: it forwards to Python through the gRPC server's channel. Blocks."""
        if self.http is not None:
            self.http.shutdown(grace_s)
        self.transport.shutdown(grace_s)

    def remove(self) -> None:
        self.backend_socket.remove()
        for unix_socket in (self.unix_socket, self.http_unix_socket):
            if unix_socket is not None:
                unix_socket.remove()


def bind_transport(
    settings: ServerSettings, backend: grpc.aio.Server, shared_memory: SharedMemory
) -> Listeners:
    """Binds the Python service's private socket and the core's public listeners; undoes what
    it bound when a later bind fails. Calls that reach the core's server before the Python
    service starts are answered UNAVAILABLE."""
    backend_socket = BackendSocket()
    if backend.add_insecure_port(backend_socket.address) == 0:
        raise OSError(f"cannot bind the Python service to {backend_socket.address}")
    unix_socket = None
    try:
        if settings.allow_grpc and settings.grpc_unix_socket:
            unix_socket = PublicUnixSocket(
                settings.grpc_unix_socket,
                int(settings.grpc_unix_socket_mode, 8),
                settings.grpc_unix_socket_group,
            )
        transport = CoreGrpcServer(
            _transport_options(settings, unix_socket, shared_memory), backend_socket.address
        )
    except (OSError, ValueError):
        backend_socket.remove()
        if unix_socket is not None:
            unix_socket.remove()
        raise
    listeners = Listeners(transport, backend_socket, unix_socket)
    try:
        if serves_http(settings):
            if settings.http_unix_socket:
                listeners.http_unix_socket = PublicUnixSocket(
                    settings.http_unix_socket,
                    int(settings.http_unix_socket_mode, 8),
                    settings.http_unix_socket_group,
                    protocol="HTTP",
                )
            listeners.http = CoreHttpServer(
                transport, _http_options(settings, listeners.http_unix_socket)
            )
        for public in (listeners.unix_socket, listeners.http_unix_socket):
            if public is not None:
                public.publish()
    except (OSError, ValueError):
        listeners.shutdown(0)
        listeners.remove()
        raise
    return listeners
