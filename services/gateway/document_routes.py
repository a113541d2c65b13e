"""K25's own routes for long documents: `POST /v1/chunks` (the chunker through the gateway)
and `POST /v1/documents/ask` (map over the chunks, reduce to one answer with citations)."""

import time

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field

from common.tracing import traceparent_of
from services.gateway.api_keys import Caller
from services.gateway.chunker_client import ChunkerError
from services.gateway.disconnect import unless_client_leaves
from services.gateway.documents import Part, citations, reduce_messages, take_notes
from services.gateway.errors import OpenAIError, invalid_request
from services.gateway.openai_schema import ChatCompletionRequest
from services.gateway.service import Gateway, ReplyShape

tracer = trace.get_tracer("k25.gateway")

# chunker error code -> (HTTP status, OpenAI type)
_CHUNKER_ERRORS = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "DEADLINE_EXCEEDED": (504, "server_error"),
    "CANCELLED": (503, "server_error"),
}


class ChunkingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    chunk_size: int | None = Field(None, ge=16, description="tokens per chunk at most (default: the chunker's)")
    overlap_ratio: float | None = Field(None, ge=0.0, le=0.5)
    semantic_threshold: float | None = Field(None, ge=0.0, le=1.0)


class ChunksRequest(ChunkingFields):
    text: str = Field(min_length=1)


class AskRequest(ChunkingFields):
    model: str
    document: str = Field(min_length=1)
    question: str = Field(min_length=1)
    max_tokens: int = Field(256, ge=1, description="tokens of the final answer at most")
    note_max_tokens: int = Field(128, ge=1, description="tokens of each chunk's note at most")
    stream: bool = False
    user: str | None = None


def install_document_routes(app: FastAPI, gateway: Gateway, caller) -> None:
    @app.post("/v1/chunks")
    async def chunks(body: ChunksRequest, request: Request, caller: Caller = Depends(caller)):
        document = await _chunk(gateway, body, body.text, request.state.span)
        return {"object": "list", "total_tokens": document.total_tokens,
                "data": [{"index": i, **_chunk_json(c)} for i, c in enumerate(document.chunks)]}

    @app.post("/v1/documents/ask")
    async def ask(body: AskRequest, request: Request, caller: Caller = Depends(caller)):
        gateway.resolve_model(body.model, caller, body.user)  # an unknown model fails before any chunking
        return await unless_client_leaves(request, _ask(gateway, body, request.state.span, caller))


async def _ask(gateway: Gateway, body: AskRequest, parent_span, caller: Caller):
    with tracer.start_as_current_span("k25.documents.ask", context=trace.set_span_in_context(parent_span)) as span:
        document = await _chunk(gateway, body, body.document, span)
        parts = [Part(i + 1, c.anchor, c.start_char, c.end_char, body.document[c.start_char:c.end_char])
                 for i, c in enumerate(document.chunks)]
        span.set_attributes({"k25.chunks": len(parts), "k25.document_tokens": document.total_tokens})
        usage = {"prompt_tokens": 0, "completion_tokens": 0}

        async def note(messages: list[dict]) -> str:
            answer = await gateway.generate(_job(gateway, body, messages, body.note_max_tokens, caller), ReplyShape(True), span)
            usage["prompt_tokens"] += answer.final.usage.prompt_tokens
            usage["completion_tokens"] += answer.final.usage.completion_tokens
            return answer.text

        parts = await take_notes(body.question, parts, note)
        final_job = _job(gateway, body, reduce_messages(body.question, parts), body.max_tokens, caller)
        if body.stream:
            return await gateway.stream(final_job, ReplyShape(True), span, epilogue=lambda text: [
                {"id": final_job.request_id, "object": "document.citations", "citations": citations(text, parts)}
            ])
        answer = await gateway.generate(final_job, ReplyShape(True), span)
    usage["prompt_tokens"] += answer.final.usage.prompt_tokens
    usage["completion_tokens"] += answer.final.usage.completion_tokens
    return JSONResponse({
        "id": final_job.request_id, "object": "document.answer", "created": int(time.time()), "model": body.model,
        "answer": answer.text, "citations": citations(answer.text, parts), "chunks": len(parts),
        "usage": {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]},
    })


async def _chunk(gateway: Gateway, fields: ChunkingFields, text: str, parent_span):
    if gateway.chunker is None:
        raise OpenAIError(503, "this gateway has no chunker (start it with --chunker-address)", "server_error",
                          "chunker_unavailable")
    with tracer.start_as_current_span("k25.chunker.chunk", context=trace.set_span_in_context(parent_span),
                                      kind=trace.SpanKind.CLIENT) as span:
        traceparent, tracestate = traceparent_of(span)
        try:
            document = await gateway.chunker.chunk(text, fields.chunk_size or 0, fields.overlap_ratio,
                                                   fields.semantic_threshold, traceparent, tracestate)
        except ChunkerError as exc:
            status, type_ = _CHUNKER_ERRORS.get(exc.code, (502, "server_error"))
            raise OpenAIError(status, f"chunker: {exc.message}", type_, exc.code.lower()) from None
        span.set_attribute("k25.chunks", len(document.chunks))
    if not document.chunks:
        raise invalid_request("the document has no text to chunk", "document")
    return document


def _chunk_json(chunk) -> dict:
    return {"start_char": chunk.start_char, "end_char": chunk.end_char, "start_token": chunk.start_token,
            "end_token": chunk.end_token, "anchor": chunk.anchor}


def _job(gateway: Gateway, body: AskRequest, messages: list[dict], max_tokens: int, caller: Caller):
    request = ChatCompletionRequest(model=body.model, messages=messages, max_tokens=max_tokens, temperature=0, user=body.user)
    return gateway.make_job(request, gateway.tokenizer.encode_chat(messages), caller, "doc")

