"""The engine's spans for requests that arrive with a trace context.

Each traced request gets a `k25.engine.request` span, a child of the caller's span (the
`traceparent` in its GenerateRequest), with children for its time in the queue, each
prefill slice (one `k25.engine.prefill_chunk` span per engine step that computed part of
its prompt; traces keep that older name) and its decoding (one span from the first decode
step to the end). The request's span says how many of its prompt tokens were found cached,
and in which KV tier (device, host memory, disk). The spans are made from the
steps' own clock readings, so tracing adds no work to the model's forward pass.
"""

import time
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from common.tracing import context_from
from engine.core.contract import StepRecord
from engine.core.request import Usage

tracer = trace.get_tracer("k25.engine")


def tier_attributes(usage: Usage) -> dict[str, int]:
    """The prompt's cached tokens by the KV tier they came from (engine/kv_tiers/)."""
    device = usage.cached_tokens - usage.host_cached_tokens - usage.disk_cached_tokens
    return {"k25.kv_tier.device_tokens": device, "k25.kv_tier.host_tokens": usage.host_cached_tokens,
            "k25.kv_tier.disk_tokens": usage.disk_cached_tokens}


@dataclass
class _Open:
    span: object
    queue: object | None
    decode: object | None = None
    decode_steps: int = 0
    prefill_slices: int = 0


class RequestTraces:
    def __init__(self, engine_id: str = "", pool: str = "", model: str = ""):
        self.attributes = {"k25.engine": engine_id, "k25.pool": pool, "gen_ai.system": "k25", "gen_ai.request.model": model}
        self._open: dict[str, _Open] = {}

    def admitted(self, request) -> None:
        """A GenerateRequest the engine accepted; untraced requests cost nothing further."""
        if not request.trace.traceparent:
            return
        parent = context_from(request.trace.traceparent, request.trace.tracestate)
        attributes = {
            **self.attributes, "k25.request_id": request.request_id, "k25.chunk_size": request.chunk_size,
            "k25.pad_tokens": request.pad_length, "gen_ai.request.max_tokens": request.sampling.max_tokens,
        }
        if request.adapter.name:
            attributes.update({"k25.adapter": request.adapter.name, "k25.adapter_version": request.adapter.version})
        span = tracer.start_span("k25.engine.request", context=parent, kind=SpanKind.SERVER, attributes=attributes)
        queue = tracer.start_span("k25.engine.queue", context=trace.set_span_in_context(span))
        self._open[request.request_id] = _Open(span, queue)

    def stepped(self, record: StepRecord | None) -> None:
        if record is None or not self._open:
            return
        for request_id, tokens, prefill in record.items:
            state = self._open.get(request_id)
            if state is None:
                continue
            if state.queue is not None:
                state.queue.end(end_time=record.start_ns)
                state.queue = None
            parent = trace.set_span_in_context(state.span)
            if prefill:
                state.prefill_slices += 1
                prefill_slice = tracer.start_span(
                    "k25.engine.prefill_chunk", context=parent, start_time=record.start_ns,
                    attributes={"k25.tokens": tokens, "k25.chunk_index": state.prefill_slices - 1},
                )
                prefill_slice.end(end_time=record.end_ns)
            else:
                if state.decode is None:
                    state.decode = tracer.start_span("k25.engine.decode", context=parent, start_time=record.start_ns)
                state.decode_steps += 1

    def finished(self, output) -> None:
        """The request's final RequestOutput (finished, aborted or failed)."""
        state = self._open.pop(output.request_id, None)
        if state is None:
            return
        now = time.time_ns()
        if state.queue is not None:
            state.queue.end(end_time=now)
        if state.decode is not None:
            state.decode.set_attribute("k25.decode_steps", state.decode_steps)
            state.decode.end(end_time=now)
        span = state.span
        span.set_attributes({"k25.prefill_chunks": state.prefill_slices,
                             "gen_ai.response.finish_reasons": [output.finish_reason.value]})
        if output.usage is not None:
            span.set_attributes({"gen_ai.usage.input_tokens": output.usage.prompt_tokens,
                                 "gen_ai.usage.output_tokens": output.usage.completion_tokens,
                                 "k25.prefix_cache.cached_tokens": output.usage.cached_tokens,
                                 "k25.prefix_cache.hit_rate": output.usage.cached_tokens / max(1, output.usage.prompt_tokens),
                                 **tier_attributes(output.usage)})
        if output.error is not None:
            span.set_status(Status(StatusCode.ERROR, f"{output.error.code.name}: {output.error.message}"))
        span.end(end_time=now)

    def close(self) -> None:
        """End what is still open (the engine is shutting down)."""
        for state in self._open.values():
            for span in (state.queue, state.decode, state.span):
                if span is not None:
                    span.end()
        self._open.clear()
