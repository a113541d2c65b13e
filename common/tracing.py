"""OpenTelemetry for every K25 process: OTLP/HTTP export when configured, W3C trace context
in and out of the protobuf `TraceContext` fields.

Export is on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
is set, e.g. `http://otel-collector:4318`; the exporter reads the other standard
`OTEL_*` variables itself. Without it the tracer is a no-op, but an incoming
`traceparent` is still passed on, so a caller's trace is never broken by a hop that does
not record.
"""

import os

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def setup_tracing(service_name: str):
    """Install an exporting tracer provider for this process; returns it (call its
    `shutdown()` on exit to flush), or None when no endpoint is configured."""
    if not any(os.environ.get(name) for name in _ENDPOINT_VARIABLES):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def context_from(traceparent: str, tracestate: str = ""):
    """The OpenTelemetry context a W3C `traceparent` (and `tracestate`) carries; an empty or
    invalid one gives a context without a parent, so the next span starts a new trace."""
    carrier = {"traceparent": traceparent} if traceparent else {}
    if tracestate:
        carrier["tracestate"] = tracestate
    return _PROPAGATOR.extract(carrier)


def traceparent_of(span) -> tuple[str, str]:
    """(traceparent, tracestate) that make `span` the parent of the next hop's spans."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", ""), carrier.get("tracestate", "")
