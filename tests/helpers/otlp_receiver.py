"""An OTLP/HTTP trace receiver inside the test process: the processes under test export to
it (OTEL_EXPORTER_OTLP_ENDPOINT) and the test reads back the spans they sent.

It decodes the wire format with opentelemetry-proto's own messages, so what the test
sees is exactly what a collector would receive."""

import gzip
import http.server
import threading
from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict
    start_ns: int
    end_ns: int


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def decode(payload: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest.FromString(payload)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(ReceivedSpan(
                    service=resource.get("service.name", ""), name=span.name, trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(), parent_span_id=span.parent_span_id.hex(), kind=span.kind,
                    attributes={a.key: _value(a.value) for a in span.attributes},
                    start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                ))
    return spans


class OtlpReceiver:
    def __init__(self):
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    with receiver.lock:
                        receiver.spans += decode(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def in_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
