"""A document cut into passages by the chunker service, for the document routes: the request
fields that say how, the call, and the chunker's refusals as HTTP errors."""

import logging

from opentelemetry import trace
from pydantic import AliasChoices, ConfigDict, Field

from common.tracing import traceparent_of
from services.gateway.chunker_client import ChunkerError
from services.gateway.errors import RETRY_AFTER_S, OpenAIError, internal_error, invalid_request
from services.gateway.openai_schema import UnicodeBody
from services.gateway.request_id import current_request_id

tracer = trace.get_tracer("k25.gateway")
log = logging.getLogger(__name__)

# chunker error code -> HTTP status and what the client is told (only INVALID_ARGUMENT's own
# message is written for the client: the others may name hosts or exceptions, and are logged)
_CHUNKER_ERRORS = {
    "DEADLINE_EXCEEDED": (504, "the chunker did not answer in time"),
    "CANCELLED": (503, "the chunker is shutting down"),
}
SPLIT_FIELDS = ("passage_tokens", "overlap_ratio", "semantic_threshold")


class SplitFields(UnicodeBody):
    """How the chunker cuts the document into passages; unset fields take the chunker's defaults."""

    model_config = ConfigDict(extra="ignore")

    passage_tokens: int | None = Field(  # ge, le: the chunker's MIN_PASSAGE_TOKENS and MAX_PASSAGE_TOKENS
        None, ge=16, le=1 << 20, validation_alias=AliasChoices("passage_tokens", "chunk_size"),
        description="a passage's token budget: most tokens in one passage the chunker cuts (default: the chunker's). "
        "`chunk_size` is accepted as its old name; it is not the pool's chunk_size.",
    )
    overlap_ratio: float | None = Field(
        None, ge=0.0, le=0.5, description="share of passage_tokens a passage may repeat from the one before"
    )
    semantic_threshold: float | None = Field(
        None, ge=0.0, le=1.0, description="weakest anchor that may end a passage by choice: 0 any line, 1 chapters only"
    )


async def split_document(gateway, fields: SplitFields, text: str, parent_span):
    """The chunker's ChunkResponse for the text: its `chunks` are the passages, in text order."""
    if gateway.chunker is None:
        raise OpenAIError(503, "this gateway has no chunker (start it with --chunker-address)", "server_error",
                          "chunker_unavailable")
    with tracer.start_as_current_span("k25.chunker.chunk", context=trace.set_span_in_context(parent_span),
                                      kind=trace.SpanKind.CLIENT) as span:
        traceparent, tracestate = traceparent_of(span)
        try:
            split = await gateway.chunker.chunk(text, fields.passage_tokens or 0, fields.overlap_ratio,
                                                fields.semantic_threshold, traceparent, tracestate)
        except ChunkerError as exc:
            raise _chunker_error(exc) from None
        span.set_attribute("k25.chunks", len(split.chunks))
    if not split.chunks:
        raise invalid_request("the document has no text to split into passages", "document")
    return split


def passage_spans(split) -> list[dict]:
    """The chunker's passages as stored and answered: spans, anchor and token count."""
    return [{"index": i, "start_char": p.start_char, "end_char": p.end_char, "start_token": p.start_token,
             "end_token": p.end_token, "anchor": p.anchor, "tokens": p.end_token - p.start_token}
            for i, p in enumerate(split.chunks)]


def _chunker_error(exc: ChunkerError) -> OpenAIError:
    if exc.code == "INVALID_ARGUMENT":
        return invalid_request(f"chunker: {exc.message}", "document", "invalid_argument")
    status, what = _CHUNKER_ERRORS.get(exc.code, (502, "the chunker failed on this document"))
    request_id = current_request_id()
    log.error("request %s: chunker error %s: %s", request_id, exc.code, exc.message)
    error = internal_error(status, what, exc.code.lower(), request_id)
    if status == 503:
        error.headers["Retry-After"] = str(RETRY_AFTER_S)
    return error
