"""The core's HTTP/REST server (Triton's HTTP API, served in C++ by ``_core.HttpServer``): bound
beside the core's gRPC server, whose snapshot, schedulers and Python backend it shares."""

from __future__ import annotations

import os
from dataclasses import dataclass

from inferd.core import HttpServer
from inferd.transport.core_server import CoreGrpcServer


@dataclass(frozen=True)
class HttpOptions:
    """How the HTTP server listens (see ``inferd.settings`` for each)."""

    addresses: list[str]
    threads: int
    header_timeout_ms: int
    idle_timeout_ms: int
    max_connections: int
    max_header_bytes: int
    max_body_bytes: int
    max_decompressed_bytes: int
    max_json_depth: int
    max_chunks: int
    use_ssl: bool = False
    use_ssl_mutual: bool = False
    server_cert_pem: str = ""
    server_key_pem: str = ""
    root_cert_pem: str = ""
    restricted_protocols: tuple[tuple[list[str], str, str], ...] = ()
    control_on_tcp: bool = False


def thread_count(setting: int) -> int:
    """--http-thread-count: 0 = one per core, at most 8 (the core computes on its own threads)."""
    return setting if setting > 0 else min(os.cpu_count() or 1, 8)


class CoreHttpServer:
    """Binds on construction, serves until ``shutdown``."""

    def __init__(self, grpc: CoreGrpcServer, options: HttpOptions) -> None:
        if HttpServer is None:
            raise OSError(
                "this inferd's core was built without the HTTP transport (INFERD_BUILD_HTTP=OFF): "
                "start it with --http-port off (or --allow-http false)"
            )
        try:
            self._server = HttpServer(
                grpc.core,
                options.addresses,
                threads=options.threads,
                header_timeout_ms=options.header_timeout_ms,
                idle_timeout_ms=options.idle_timeout_ms,
                max_connections=options.max_connections,
                max_header_bytes=options.max_header_bytes,
                max_body_bytes=options.max_body_bytes,
                max_decompressed_bytes=options.max_decompressed_bytes,
                max_json_depth=options.max_json_depth,
                max_chunks=options.max_chunks,
                use_ssl=options.use_ssl,
                use_ssl_mutual=options.use_ssl_mutual,
                server_cert_pem=options.server_cert_pem,
                server_key_pem=options.server_key_pem,
                root_cert_pem=options.root_cert_pem,
                restricted_protocols=list(options.restricted_protocols),
                control_on_tcp=options.control_on_tcp,
            )
        except RuntimeError as e:
            raise OSError(str(e)) from None

    @property
    def ports(self) -> list[int]:
        """The bound port of each address (0 for a Unix socket)."""
        ports: list[int] = self._server.ports
        return ports

    def shutdown(self, grace_s: float) -> None:
        """Blocks until every connection is closed: run it off the event loop, which answers
        the calls it forwards to Python."""
        self._server.shutdown(grace_s)
