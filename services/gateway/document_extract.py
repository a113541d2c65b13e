"""`POST /v1/documents/extract`: one object of a JSON schema for a whole document (stored, or
sent with the request), each field with the passages and the clause it came from, null where
no passage supports a value (extraction.py).

Everything that can refuse the request (the schema, the fan-out, the tenant's rate, the
document) is checked before any engine work; the passages of every field are then read at
once, at most --document-fanout engine requests at a time."""

import asyncio
import itertools
import json
import time
import uuid
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from opentelemetry import trace
from pydantic import Field

from common.anchors import find_anchors
from proto import k25_pb2
from services.gateway.api_keys import Caller
from services.gateway.disconnect import unless_client_leaves
from services.gateway.document_jobs import Usage, document_job
from services.gateway.document_request import DocumentRequest, load_document
from services.gateway.document_stream import progress_event, progress_stream
from services.gateway.documents import NOTHING, all_bounded, choose_passages, map_messages, passages_of
from services.gateway.errors import invalid_request
from services.gateway.extraction import (
    ExtractField,
    Reading,
    answer_schema,
    answer_validator,
    answered_value,
    citation,
    extraction_cost,
    fields_of,
    settle,
    too_many_reads,
    value_messages,
)
from services.gateway.openai_schema import estimated_tokens
from services.gateway.quote_grammar import quote_grammar
from services.gateway.responses import sse
from services.gateway.schema_policy import SchemaRefused
from services.gateway.service import ReplyShape

tracer = trace.get_tracer("k25.gateway")


class ExtractRequest(DocumentRequest):
    # `schema` would shadow a BaseModel method: the field keeps its name on the wire only
    json_schema: dict[str, Any] = Field(alias="schema", description="an object schema, one property per field to "
                                        "extract; each field's `description` says what it is")
    passages: int | None = Field(None, ge=1, description="passages read per field, the most relevant to it (default: "
                                 "the gateway's --document-passages-read; fields x passages at most "
                                 "--max-document-passages)")
    max_tokens: int = Field(128, ge=1, description="tokens of each value at most")
    note_max_tokens: int = Field(128, ge=1, description="tokens of each passage's note at most")
    stream: bool = False

    def reserved_tokens(self) -> int:
        """What a tenant's token rate is charged at admission: the document (estimated), one note
        and one value; the rest once the passages are chosen, before any is read."""
        return estimated_tokens(self.document or "") + self.note_max_tokens + self.max_tokens


def install_extract_route(app: FastAPI, gateway, caller) -> None:
    @app.post("/v1/documents/extract")
    async def extract(body: ExtractRequest, request: Request, caller: Caller = Depends(caller)):
        gateway.resolve_model(body.model, caller, body.user)  # an unknown model fails before the chunker is asked
        try:
            fields = fields_of(body.json_schema)
        except SchemaRefused as exc:
            raise invalid_request(f"schema: {exc}", "schema", "invalid_schema") from None
        s = gateway.settings
        per_field = body.passages or s.document_passages_read
        refusal = too_many_reads(len(fields), per_field, s.max_document_passages)
        if refusal is not None:
            raise refusal
        schemas = [answer_schema(field, body.json_schema) for field in fields]
        for field, schema in zip(fields, schemas):
            why = await gateway.grammars.check(k25_pb2.Constraint(json_schema=json.dumps(schema, ensure_ascii=False)))
            if why is not None:
                raise invalid_request(f"schema.properties.{field.name}: {why}", "schema", "invalid_schema")
        ticket = request.state.ticket
        ticket.reserve(body.reserved_tokens())
        return await unless_client_leaves(request, _extract(gateway, body, fields, schemas, per_field, request.state.span,
                                                            caller, ticket))


async def _extract(gateway, body: ExtractRequest, fields: list[ExtractField], schemas: list[dict], per_field: int,
                   parent_span, caller: Caller, ticket):
    deadline = time.time() + gateway.settings.request_timeout_s  # one deadline for every read
    with tracer.start_as_current_span("k25.documents.extract", context=trace.set_span_in_context(parent_span)) as span:
        text, spans, total_tokens, _ = await load_document(gateway, body, caller, span)
        every = passages_of(text, spans)
        # off the event loop: BM25 over hundreds of passages, once per field, is CPU work
        chosen = await asyncio.to_thread(lambda: [choose_passages(f.query, every, per_field) for f in fields])
        tokens = {s["index"] + 1: s["end_token"] - s["start_token"] for s in spans}
        cost = sum(extraction_cost([tokens[p.index] for p in read], estimated_tokens(field.question),
                                   body.note_max_tokens, body.max_tokens) for field, read in zip(fields, chosen))
        ticket.reserve(max(0, cost - body.reserved_tokens()))  # 429 now, before any engine work
        span.set_attributes({"k25.chunks": len(every), "k25.fields": len(fields),
                             "k25.chunks_read": sum(len(read) for read in chosen), "k25.document_tokens": total_tokens})
        usage = Usage()
        validators = [answer_validator(schema) for schema in schemas]

        async def generate(messages: list[dict], max_tokens: int, constraint=None) -> str:
            job = await document_job(gateway, body.model, body.user, messages, max_tokens, caller, ticket, deadline)
            if constraint is not None:
                job.sampling.constraint.CopyFrom(constraint)
            answer = await gateway.generate(job, ReplyShape(True), span)
            usage.add(answer.final.usage)
            return answer.text

        async def read(f: int, passage) -> Reading:
            field = fields[f]
            note = await generate(map_messages(field.question, passage), body.note_max_tokens)
            if note.strip().upper().startswith(NOTHING):
                return Reading(passage, None)
            grammar = quote_grammar(field.schema, passage.text)
            constraint = k25_pb2.Constraint(lark=grammar) if grammar is not None else \
                k25_pb2.Constraint(json_schema=json.dumps(schemas[f], ensure_ascii=False))
            value = await generate(value_messages(field, passage, note), body.max_tokens, constraint)
            return Reading(passage, answered_value(value, validators[f]))

        pairs = [(f, passage) for f, read_for in enumerate(chosen) for passage in read_for]
        passages_read = {field.name: [p.citation() for p in read] for field, read in zip(fields, chosen)}

        async def read_all(progress=lambda event: None) -> list[list[Reading]]:
            done = itertools.count(1)

            async def one(f: int, passage) -> Reading:
                reading = await read(f, passage)
                progress(progress_event(next(done), len(pairs), passage, field=fields[f].name,
                                        gave_value=reading.value is not None))
                return reading

            readings = await all_bounded([lambda f=f, p=p: one(f, p) for f, p in pairs], gateway.settings.document_fanout)
            by_field = [[] for _ in fields]
            for (f, _), reading in zip(pairs, readings):
                by_field[f].append(reading)
            return by_field

        async def result(by_field: list[list[Reading]]) -> dict:
            settled = [settle(readings) for readings in by_field]
            anchors = await asyncio.to_thread(find_anchors, text) if any(cited for _, cited in settled) else []
            return {
                "id": f"docx-{uuid.uuid4().hex}", "object": "document.extraction", "created": int(time.time()),
                "model": body.model, "document_id": body.document_id,
                "data": {field.name: value for field, (value, _) in zip(fields, settled)},
                "fields": {field.name: {"value": value, "citations": [citation(p, at, anchors) for p, at in cited],
                                        "passages_read": passages_read[field.name]}
                           for field, (value, cited) in zip(fields, settled)},
                "chunks": len(every), "usage": usage.body(),
            }

        if body.stream:
            by_field: list = []

            async def read_streamed(progress) -> None:
                by_field.extend(await read_all(progress))

            async def ending():
                return _last_events(await result(by_field))

            return progress_stream(gateway, {"object": "document.passages", "fields": passages_read}, read_streamed, ending)
        return JSONResponse(await result(await read_all()))


async def _last_events(result: dict):
    yield sse(result)
    yield sse("[DONE]")
