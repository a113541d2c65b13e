"""The root span of every HTTP request, continuing the caller's `traceparent` if it sent one.

A pure ASGI middleware rather than a route decorator: the span ends only when the whole
response has been sent, which for a streamed answer is its last event. Handlers find the
span in `request.state.span` to hang their own spans and attributes on.
"""

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from common.tracing import context_from

tracer = trace.get_tracer("k25.gateway")


class TracingMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        method, path = scope["method"], scope["path"]
        span = tracer.start_span(
            f"{method} {path}", context=context_from(headers.get("traceparent", ""), headers.get("tracestate", "")),
            kind=SpanKind.SERVER, attributes={"http.request.method": method, "url.path": path},
        )
        scope.setdefault("state", {})["span"] = span
        status = 500

        async def send_and_watch(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            span.end()
