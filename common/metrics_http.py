"""A process's own Prometheus registry and the small HTTP port that serves it at /metrics,
plus /healthz for a process that judges its own health.

Each server owns its registry (not prometheus_client's global one), so that several
servers in one process, as in tests, never collide.

/healthz (a Kubernetes liveness probe's path) answers the JSON object the process's health
callable returns: status 200 when its "healthy" is true, 503 otherwise."""

import json
import socket
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

HEALTH_PATH = "/healthz"


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _IPv6ThreadingServer(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # a scrape or a probe every few seconds is no news
        pass


class MetricsEndpoint:
    def __init__(self):
        self.registry = CollectorRegistry()
        self._http = None

    def serve(self, port: int, address: str = "0.0.0.0", health: Callable[[], dict] | None = None) -> int:
        """Serve /metrics (and /healthz when `health` is given) on `address`:`port` (port 0: a free
        one) from a daemon thread; returns the port."""
        metrics = make_wsgi_app(self.registry)

        def app(environ, start_response):
            if health is None or environ.get("PATH_INFO") != HEALTH_PATH:
                return metrics(environ, start_response)
            body = health()
            status = "200 OK" if body.get("healthy") else "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json"), ("Cache-Control", "no-store")])
            return [json.dumps(body).encode()]

        server_class = _IPv6ThreadingServer if ":" in address else _ThreadingServer
        self._http = make_server(address, port, app, server_class, handler_class=_QuietHandler)
        threading.Thread(target=self._http.serve_forever, name="metrics-http", daemon=True).start()
        return self._http.server_port

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
