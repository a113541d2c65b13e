"""K25's own routes for long documents: `POST /v1/chunks` (the chunker through the gateway: the
document's passages) and `POST /v1/documents/ask` (map over the passages, reduce to one answer
with citations).

The routes and their response fields ("data", "chunks", ...) keep their names: each "chunk" they
speak of is a passage. The request field `passage_tokens` (a passage's token budget, not a pool's
`chunk_size`) still accepts its old name `chunk_size`."""

import asyncio
import itertools
import time

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from opentelemetry import trace
from pydantic import Field

from services.gateway.admission import Ticket
from services.gateway.api_keys import Caller
from services.gateway.disconnect import unless_client_leaves
from services.gateway.document_extract import install_extract_route
from services.gateway.document_jobs import Usage, document_job
from services.gateway.document_request import DocumentRequest, load_document
from services.gateway.document_split import SplitFields, passage_spans, split_document
from services.gateway.document_store_routes import install_document_store_routes
from services.gateway.document_stream import progress_event, progress_stream
from services.gateway.documents import (
    Passage,
    choose_passages,
    citations,
    note_line,
    notes_that_fit,
    passages_of,
    question_cost,
    reduce_messages,
    take_notes,
    too_many_passages,
)
from services.gateway.openai_schema import estimated_tokens
from services.gateway.passages_together import Reading, how_to_read, together_citations, together_messages
from services.gateway.routing import largest_context
from services.gateway.service import Gateway, ReplyShape

tracer = trace.get_tracer("k25.gateway")


class ChunksRequest(SplitFields):
    text: str = Field(min_length=1)


class AskRequest(DocumentRequest):
    question: str = Field(min_length=1)
    passages: int | None = Field(None, ge=1, description="passages to read, the most relevant to the question "
                                 "(default: the gateway's --document-passages-read; at most --max-document-passages)")
    max_tokens: int = Field(256, ge=1, description="tokens of the final answer at most")
    note_max_tokens: int = Field(128, ge=1, description="tokens of each passage's note at most")
    read: Reading = Field("auto", description="how the passages are read: `together` in one prompt with the question, "
                          "answered once; `notes` a note on each passage, then an answer from the notes; `auto` "
                          "together when the passages and the answer fit the model's context, else notes")
    stream: bool = False

    def reserved_tokens(self) -> int:
        """What a tenant's token rate is charged at admission: the document and question (estimated
        before tokenising), one note and the answer; the rest of the question's cost (documents.py
        `question_cost`) once the passages are chosen, before any note is asked for."""
        return estimated_tokens(self.document or "") + estimated_tokens(self.question) + self.note_max_tokens + \
            self.max_tokens


def install_document_routes(app: FastAPI, gateway: Gateway, caller) -> None:
    install_document_store_routes(app, gateway, caller)
    install_extract_route(app, gateway, caller)

    @app.post("/v1/chunks")
    async def chunks(body: ChunksRequest, request: Request, caller: Caller = Depends(caller)):
        # cutting is charged to the tenant's token rate as the text's tokens, like a prompt
        ticket = request.state.ticket
        ticket.reserve(estimated_tokens(body.text))
        split = await split_document(gateway, body, body.text, request.state.span)
        ticket.use(split.total_tokens)
        return {"object": "list", "total_tokens": split.total_tokens, "data": passage_spans(split)}

    @app.post("/v1/documents/ask")
    async def ask(body: AskRequest, request: Request, caller: Caller = Depends(caller)):
        gateway.resolve_model(body.model, caller, body.user)  # an unknown model fails before the chunker is asked
        ticket = request.state.ticket
        ticket.reserve(body.reserved_tokens())
        return await unless_client_leaves(request, _ask(gateway, body, request.state.span, caller, ticket))


async def _ask(gateway: Gateway, body: AskRequest, parent_span, caller: Caller, ticket: Ticket):
    # one deadline for the whole request: every passage's note and the answer share it
    deadline = time.time() + gateway.settings.request_timeout_s
    read_count = body.passages or gateway.settings.document_passages_read
    refusal = too_many_passages(read_count, gateway.settings.max_document_passages)
    if refusal is not None:
        raise refusal
    with tracer.start_as_current_span("k25.documents.ask", context=trace.set_span_in_context(parent_span)) as span:
        text, spans, total_tokens, warm = await load_document(gateway, body, caller, span)
        every = passages_of(text, spans)
        # off the event loop: BM25 over hundreds of passages is CPU work
        passages = await asyncio.to_thread(choose_passages, body.question, every, read_count)
        chosen = sorted(passages, key=lambda p: p.index)
        tokens = {s["index"] + 1: s["end_token"] - s["start_token"] for s in spans}
        together = together_messages(body.question, chosen)
        context = largest_context(gateway.registry.pools.values())
        together_tokens = await _together_tokens(gateway, body, together, sum(tokens[p.index] for p in chosen), context,
                                                 warm)
        reading = how_to_read(body.read, together_tokens, body.max_tokens, context, warm)
        # the whole question's tokens up front (the admission reserved a first estimate): a tenant
        # whose rate cannot pay for it gets 429 before any engine work, not after its notes ran
        cost = together_tokens + body.max_tokens if reading == "together" else question_cost(
            [tokens[p.index] for p in passages], estimated_tokens(body.question), body.note_max_tokens, body.max_tokens)
        ticket.reserve(max(0, cost - body.reserved_tokens()))
        span.set_attributes({"k25.chunks": len(every), "k25.chunks_read": len(passages),
                             "k25.document_tokens": total_tokens, "k25.read": reading})
        read = [p.citation() for p in passages]  # best first
        answered = {"document_id": body.document_id, "chunks": len(every), "passages_read": read, "read": reading}
        if reading == "together":
            return await _answer_together(gateway, body, together, chosen, answered, caller, ticket, deadline, span)
        usage = Usage()

        async def note(messages: list[dict]) -> str:
            job = await _job(gateway, body, messages, body.note_max_tokens, caller, ticket, deadline)
            answer = await gateway.generate(job, ReplyShape(True), span)
            usage.add(answer.final.usage)
            return answer.text

        ranks, fanout = [p.index for p in passages], gateway.settings.document_fanout
        if body.stream:
            noted: list[Passage] = []

            async def read_notes(progress) -> None:
                done = itertools.count(1)
                noted.extend(await take_notes(body.question, chosen, note, fanout, lambda passage: progress(
                    progress_event(next(done), len(read), passage, bears_on_question=passage.relevant))))

            async def streamed_answer():
                kept, left_out = await _notes_that_fit(gateway, body, noted, ranks, span)
                final = await _job(gateway, body, reduce_messages(body.question, kept), body.max_tokens, caller, ticket,
                                   deadline)
                return await _streamed(gateway, final, span, lambda answer_text: {
                    "citations": citations(answer_text, kept), "passages_read": read, "read": reading,
                    "notes_left_out": left_out})

            return progress_stream(gateway, _opening(answered), read_notes, streamed_answer)
        noted = await take_notes(body.question, chosen, note, fanout)
        kept, left_out = await _notes_that_fit(gateway, body, noted, ranks, span)
        final_job = await _job(gateway, body, reduce_messages(body.question, kept), body.max_tokens, caller, ticket,
                               deadline)
        answer = await gateway.generate(final_job, ReplyShape(True), span)
    usage.add(answer.final.usage)
    return _answer(body, final_job, answer.text, citations(answer.text, kept), answered, left_out, usage)


async def _together_tokens(gateway: Gateway, body: AskRequest, messages: list[dict], passage_tokens: int,
                           context: int | None, warm: bool) -> int:
    """The prompt's tokens when the passages are read together; only their own tokens (fewer) when
    they will not be read together anyway (notes asked for, or `auto` on a warmed document), or
    already fill the largest `context`: every passage of a long document is not rendered and
    tokenised again to learn that it does not fit."""
    if body.read == "notes" or (body.read == "auto" and warm) or (context is not None and passage_tokens > context):
        return passage_tokens
    return len(await gateway.encoder.encode_chat(messages))


async def _answer_together(gateway: Gateway, body: AskRequest, messages: list[dict], chosen: list[Passage],
                           answered: dict, caller: Caller, ticket: Ticket, deadline: float, span):
    """The question answered from its passages in one prompt (passages_together.py)."""
    job = await _job(gateway, body, messages, body.max_tokens, caller, ticket, deadline)
    if body.stream:
        async def nothing_to_note(progress) -> None:
            return None

        async def streamed_answer():
            return await _streamed(gateway, job, span, lambda answer_text: {
                "citations": together_citations(answer_text, chosen), "passages_read": answered["passages_read"],
                "read": "together", "notes_left_out": 0})

        return progress_stream(gateway, _opening(answered), nothing_to_note, streamed_answer)
    answer = await gateway.generate(job, ReplyShape(True), span)
    usage = Usage()
    usage.add(answer.final.usage)
    return _answer(body, job, answer.text, together_citations(answer.text, chosen), answered, 0, usage)


def _opening(answered: dict) -> dict:
    """A streamed answer's first event: the passages it reads, and how, before any is read."""
    return {"object": "document.passages", "passages_read": answered["passages_read"], "read": answered["read"]}


async def _streamed(gateway: Gateway, job, span, epilogue):
    """The answer's events, ending with one `document.citations` event (`epilogue(answer_text)`'s fields)."""
    answer = await gateway.stream(job, ReplyShape(True), span, epilogue=lambda answer_text: [
        {"id": job.request_id, "object": "document.citations", **epilogue(answer_text)}])
    return answer.body_iterator


def _answer(body: AskRequest, job, text: str, cited: list[dict], answered: dict, left_out: int, usage: Usage):
    return JSONResponse({
        "id": job.request_id, "object": "document.answer", "created": int(time.time()), "model": body.model,
        "answer": text, "citations": cited, **answered, "notes_left_out": left_out, "usage": usage.body(),
    })


async def _notes_that_fit(gateway: Gateway, body: AskRequest, noted: list[Passage], ranks: list[int],
                          span) -> tuple[list[Passage], int]:
    """The notes the answer's prompt has room for beside `max_tokens` in the largest context of the
    pools (documents.py `notes_that_fit`), and how many notes bearing on the question were left out.
    Before any engine is seen no context is known: every note goes in."""
    context = largest_context(gateway.registry.pools.values())
    if context is None:
        return noted, 0
    by_index = {p.index: p for p in noted}
    ranked = [by_index[index] for index in ranks]
    fixed = len(await gateway.encoder.encode_chat(reduce_messages(body.question, [])))
    lines = await asyncio.to_thread(lambda: [len(gateway.tokenizer.encode(note_line(p), add_special_tokens=False))
                                             if p.relevant else 0 for p in ranked])
    kept, left_out = notes_that_fit(ranked, lines, context - body.max_tokens - fixed)
    span.set_attribute("k25.notes_left_out", left_out)
    return kept, left_out


async def _job(gateway: Gateway, body: AskRequest, messages: list[dict], max_tokens: int, caller: Caller, ticket: Ticket,
               deadline: float):
    return await document_job(gateway, body.model, body.user, messages, max_tokens, caller, ticket, deadline)
