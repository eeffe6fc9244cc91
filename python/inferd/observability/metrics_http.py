"""The ``/metrics`` endpoint: it answers that path only (any other is 404) and writes no
``*_created`` series, whatever collector the registry holds."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import Metric
from prometheus_client.exposition import ThreadingWSGIServer

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

METRICS_PATH = "/metrics"


class WithoutCreated:
    """A registry's metrics less their ``*_created`` samples, which prometheus_client adds to
    its counters, histograms and summaries and which Triton does not write. Filtered here, at
    exposition, rather than with ``prometheus_client.disable_created_metrics()``, which would
    change every registry of the process (the library's switch is a module global)."""

    _CREATED_TYPES = frozenset({"counter", "histogram", "summary"})

    def __init__(self, registry: Any) -> None:  # a CollectorRegistry or a restricted view
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            if metric.type in self._CREATED_TYPES:
                created = metric.name + "_created"
                kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                kept.samples = [s for s in metric.samples if s.name != created]
                metric = kept
            yield metric

    def restricted_registry(self, names: Iterable[str]) -> WithoutCreated:
        """The same, for ``/metrics?name[]=...`` (prometheus_client's exposition calls it)."""
        return WithoutCreated(self._registry.restricted_registry(names))


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


def metrics_app(registry: CollectorRegistry) -> WSGIApplication:
    """prometheus_client's WSGI app for ``registry`` (content negotiation, gzip, ``name[]``)
    without ``*_created``, on ``/metrics`` only: it answers any path itself."""
    exposition: WSGIApplication = make_wsgi_app(WithoutCreated(registry))

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"not found: metrics are at {METRICS_PATH}\n".encode()]
        return exposition(environ, start_response)

    return app


class MetricsEndpoint:
    """``registry`` on ``/metrics``, served on a thread of its own between ``serve`` and
    ``close``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._http: tuple[WSGIServer, threading.Thread] | None = None

    def serve(self, host: str, port: int) -> int:
        """Starts ``/metrics`` on a thread of its own; returns the bound port."""

        # The address family the host resolves to (IPv6 too), as start_http_server chooses it.
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, address = info[0][0], str(info[0][4][0])

        class Server(ThreadingWSGIServer):
            address_family = family

        server = make_server(
            address, port, metrics_app(self._registry), Server, handler_class=_QuietHandler
        )
        thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
        thread.start()
        self._http = (server, thread)
        return int(server.server_port)

    def close(self) -> None:
        if self._http is not None:
            server, thread = self._http
            server.shutdown()
            server.server_close()
            thread.join()
            self._http = None
