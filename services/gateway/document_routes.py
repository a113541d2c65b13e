"""K25's own routes for long documents: `POST /v1/chunks` (the chunker through the gateway: the
document's passages) and `POST /v1/documents/ask` (map over the passages, reduce to one answer
with citations).

The routes and their response fields ("data", "chunks", ...) keep their names: each "chunk" they
speak of is a passage. The request field `passage_tokens` (a passage's token budget, not a pool's
`chunk_size`) still accepts its old name `chunk_size`."""

import logging
import time

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from opentelemetry import trace
from pydantic import AliasChoices, ConfigDict, Field

from common.tracing import traceparent_of
from services.gateway.admission import Ticket
from services.gateway.api_keys import Caller
from services.gateway.chunker_client import ChunkerError
from services.gateway.disconnect import unless_client_leaves
from services.gateway.documents import (
    Passage,
    citations,
    question_cost,
    reduce_messages,
    take_notes,
    too_many_passages,
)
from services.gateway.errors import RETRY_AFTER_S, OpenAIError, internal_error, invalid_request
from services.gateway.openai_schema import ChatCompletionRequest, UnicodeBody, estimated_tokens
from services.gateway.request_id import current_request_id
from services.gateway.service import Gateway, ReplyShape

tracer = trace.get_tracer("k25.gateway")
log = logging.getLogger(__name__)

# chunker error code -> HTTP status and what the client is told (only INVALID_ARGUMENT's own
# message is written for the client: the others may name hosts or exceptions, and are logged)
_CHUNKER_ERRORS = {
    "DEADLINE_EXCEEDED": (504, "the chunker did not answer in time"),
    "CANCELLED": (503, "the chunker is shutting down"),
}


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


class ChunksRequest(SplitFields):
    text: str = Field(min_length=1)


class AskRequest(SplitFields):
    model: str
    document: str = Field(min_length=1)
    question: str = Field(min_length=1)
    max_tokens: int = Field(256, ge=1, description="tokens of the final answer at most")
    note_max_tokens: int = Field(128, ge=1, description="tokens of each passage's note at most")
    stream: bool = False
    user: str | None = None

    def reserved_tokens(self) -> int:
        """What a tenant's token rate is charged at admission: the document and question (estimated
        before tokenising), one note and the answer; the rest of the question's cost (documents.py
        `question_cost`) once the document is cut, before any note is asked for."""
        return estimated_tokens(self.document) + estimated_tokens(self.question) + self.note_max_tokens + self.max_tokens


def install_document_routes(app: FastAPI, gateway: Gateway, caller) -> None:
    @app.post("/v1/chunks")
    async def chunks(body: ChunksRequest, request: Request, caller: Caller = Depends(caller)):
        # cutting is charged to the tenant's token rate as the text's tokens, like a prompt
        ticket = request.state.ticket
        ticket.reserve(estimated_tokens(body.text))
        split = await _split(gateway, body, body.text, request.state.span)
        ticket.use(split.total_tokens)
        return {"object": "list", "total_tokens": split.total_tokens,
                "data": [{"index": i, **_passage_json(p)} for i, p in enumerate(split.chunks)]}

    @app.post("/v1/documents/ask")
    async def ask(body: AskRequest, request: Request, caller: Caller = Depends(caller)):
        gateway.resolve_model(body.model, caller, body.user)  # an unknown model fails before the chunker is asked
        ticket = request.state.ticket
        ticket.reserve(body.reserved_tokens())
        return await unless_client_leaves(request, _ask(gateway, body, request.state.span, caller, ticket))


async def _ask(gateway: Gateway, body: AskRequest, parent_span, caller: Caller, ticket: Ticket):
    # one deadline for the whole request: every passage's note and the answer share it
    deadline = time.time() + gateway.settings.request_timeout_s
    with tracer.start_as_current_span("k25.documents.ask", context=trace.set_span_in_context(parent_span)) as span:
        split = await _split(gateway, body, body.document, span)
        refusal = too_many_passages(len(split.chunks), gateway.settings.max_document_passages, body.passage_tokens)
        if refusal is not None:
            raise refusal
        # the whole question's tokens up front (the admission reserved a first estimate): a tenant
        # whose rate cannot pay for it gets 429 before any engine work, not after its notes ran
        cost = question_cost([p.end_token - p.start_token for p in split.chunks], estimated_tokens(body.question),
                             body.note_max_tokens, body.max_tokens)
        ticket.reserve(max(0, cost - body.reserved_tokens()))
        passages = [Passage(i + 1, p.anchor, p.start_char, p.end_char, body.document[p.start_char:p.end_char])
                    for i, p in enumerate(split.chunks)]
        span.set_attributes({"k25.chunks": len(passages), "k25.document_tokens": split.total_tokens})
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}

        async def note(messages: list[dict]) -> str:
            job = await _job(gateway, body, messages, body.note_max_tokens, caller, ticket, deadline)
            answer = await gateway.generate(job, ReplyShape(True), span)
            _add_usage(usage, answer.final.usage)
            return answer.text

        passages = await take_notes(body.question, passages, note, gateway.settings.document_fanout)
        final_job = await _job(gateway, body, reduce_messages(body.question, passages), body.max_tokens, caller, ticket,
                               deadline)
        if body.stream:
            return await gateway.stream(final_job, ReplyShape(True), span, epilogue=lambda text: [
                {"id": final_job.request_id, "object": "document.citations", "citations": citations(text, passages)}
            ])
        answer = await gateway.generate(final_job, ReplyShape(True), span)
    _add_usage(usage, answer.final.usage)
    return JSONResponse({
        "id": final_job.request_id, "object": "document.answer", "created": int(time.time()), "model": body.model,
        "answer": answer.text, "citations": citations(answer.text, passages), "chunks": len(passages),
        "usage": {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
                  "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
                  "prompt_tokens_details": {"cached_tokens": usage["cached_tokens"]}},
    })


async def _split(gateway: Gateway, fields: SplitFields, text: str, parent_span):
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


def _add_usage(total: dict, usage) -> None:
    total["prompt_tokens"] += usage.prompt_tokens
    total["completion_tokens"] += usage.completion_tokens
    total["cached_tokens"] += usage.cached_tokens


def _passage_json(passage) -> dict:
    return {"start_char": passage.start_char, "end_char": passage.end_char, "start_token": passage.start_token,
            "end_token": passage.end_token, "anchor": passage.anchor}


async def _job(gateway: Gateway, body: AskRequest, messages: list[dict], max_tokens: int, caller: Caller, ticket: Ticket,
               deadline: float):
    if time.time() >= deadline:  # nothing more is sent to an engine for a request that has run out of time
        raise OpenAIError(504, "the request's deadline passed before every passage was read", "server_error", "timeout")
    request = ChatCompletionRequest(model=body.model, messages=messages, max_tokens=max_tokens, temperature=0, user=body.user)
    job = gateway.make_job(request, await gateway.encoder.encode_chat(messages), caller, "doc", deadline)
    ticket.use(len(job.prompt_token_ids) + job.sampling.max_tokens)
    return job

