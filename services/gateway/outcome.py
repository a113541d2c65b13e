"""The bookkeeping of one request from its start to its end: the in-flight count, the
Redis accounting, the Prometheus metrics, and the span of its trip to the engines (whose
context goes to them in the Job)."""

import time

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from common.tracing import traceparent_of
from proto import k25_pb2
from services.gateway.canary import canary_outcome
from services.gateway.dispatch import Job
from services.gateway.responses import FINISH_REASONS

tracer = trace.get_tracer("k25.gateway")


class RequestOutcome:
    """Books one request's end exactly once: accounting, metrics, the in-flight count, and
    the span that covers its trip to the engines (its context goes to them in the Job)."""

    def __init__(self, gateway, pool: str | None, started: float, job: Job, chat: bool, parent_span):
        """`pool`: the pool whose demand the request is (dispatch.demand_pool); None when no
        pool the gateway knows of would hold it."""
        self.gateway, self.pool, self.started = gateway, pool or "unrouted", started
        self.adapter, self.tenant = job.adapter, job.tenant
        self.expected_cached_tokens = 0  # what the prefix index expected the chosen engine to hold
        self._first_token_seen = False
        self._done = False
        if pool is not None:
            gateway.accounting.arrived(pool, started)
        gateway.inflight += 1
        gateway.metrics.inflight.inc()
        operation = "chat" if chat else "text_completion"
        self.span = tracer.start_span(
            f"{operation} {job.model}", context=trace.set_span_in_context(parent_span), kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": operation, "gen_ai.system": "k25", "gen_ai.request.model": job.model,
                "gen_ai.request.max_tokens": job.sampling.max_tokens,
                "gen_ai.request.temperature": job.sampling.temperature, "gen_ai.request.top_p": job.sampling.top_p, "gen_ai.response.id": job.request_id,
                "k25.tenant": job.tenant, "k25.prompt_tokens": len(job.prompt_token_ids),
                **({"k25.adapter": job.adapter.name, "k25.adapter_version": job.adapter.version,
                    "k25.ab_group": job.adapter.group} if job.adapter else {}),
            },
        )
        job.traceparent, job.tracestate = traceparent_of(self.span)

    def opened(self, opened) -> None:
        self.pool = opened.pool
        self.expected_cached_tokens = opened.expected_cached_tokens
        self.span.set_attributes({"k25.pool": opened.pool, "k25.engine": opened.engine.engine_id,
                                  "k25.chunk_size": opened.engine.chunk_size})

    def first_token(self) -> None:
        if not self._first_token_seen:
            self._first_token_seen = True
            self.span.add_event("first_token")
            self.gateway.metrics.ttft.labels(self.pool).observe(time.time() - self.started)

    def finished(self, final: k25_pb2.Final) -> None:
        self.span.set_attributes({
            "gen_ai.usage.input_tokens": final.usage.prompt_tokens, "gen_ai.usage.output_tokens": final.usage.completion_tokens,
            "gen_ai.response.finish_reasons": [FINISH_REASONS[final.finish_reason]],
            "k25.pad_tokens": final.usage.pad_tokens, "k25.cached_tokens": final.usage.cached_tokens,
            "k25.expected_cached_tokens": self.expected_cached_tokens,
        })
        expected, found = self.expected_cached_tokens > 0, final.usage.cached_tokens > 0
        result = {(True, True): "hit", (True, False): "miss", (False, True): "unexpected_hit", (False, False): "none"}
        metrics, usage = self.gateway.metrics, final.usage
        metrics.prefix_routing.labels(result[expected, found]).inc()
        metrics.prompt_tokens.labels(self.pool).inc(usage.prompt_tokens)
        lower_tiers = {"host": usage.host_cached_tokens, "disk": usage.disk_cached_tokens}
        for tier, tokens in {"device": usage.cached_tokens - sum(lower_tiers.values()), **lower_tiers}.items():
            metrics.cached_prompt_tokens.labels(self.pool, tier).inc(max(0, tokens))

    def done(self, status: int) -> None:
        if self._done:
            return
        self._done = True
        now = time.time()
        g = self.gateway
        g.inflight -= 1
        g.metrics.inflight.dec()
        g.metrics.requests.labels(self.pool, str(status)).inc()
        g.metrics.latency.labels(self.pool).observe(now - self.started)
        failed = status >= 500
        adapter = self.adapter
        if adapter is not None:
            counted = canary_outcome(adapter.group, status)
            if counted is not None:
                g.accounting.finished(adapter.name, adapter.version, now, now - self.started, counted, self.tenant)
            g.metrics.lora_requests.labels(adapter.name, adapter.version, adapter.group, str(status)).inc()
            if not failed:
                g.metrics.lora_latency.labels(adapter.name, adapter.group).observe(now - self.started)
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.end()
