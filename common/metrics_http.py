"""A process's own Prometheus registry and the small HTTP port that serves it at /metrics.

Each server owns its registry (not prometheus_client's global one), so that several
servers in one process, as in tests, never collide."""

from prometheus_client import CollectorRegistry, start_http_server


class MetricsEndpoint:
    def __init__(self):
        self.registry = CollectorRegistry()
        self._http = None

    def serve(self, port: int, address: str = "0.0.0.0") -> int:
        """Serve /metrics on `port` (0: a free one); returns the port."""
        self._http, _ = start_http_server(port, address, registry=self.registry)
        return self._http.server_port

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
