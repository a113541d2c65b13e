"""What the routes that read a stored or sent document share (a question, an extraction): the
request fields that name the document, and the document loaded from the store or cut now."""

import asyncio
from typing import NamedTuple

import redis
from pydantic import Field, model_validator

from services.gateway.api_keys import Caller
from services.gateway.document_split import SPLIT_FIELDS, SplitFields, passage_spans, split_document
from services.gateway.document_store_routes import document_not_found, store_of, store_unavailable


class DocumentRequest(SplitFields):
    model: str
    document: str | None = Field(None, min_length=1, description="the document's text; or `document_id`")
    document_id: str | None = Field(None, description="a document stored with POST /v1/documents; or `document`")
    user: str | None = None

    @model_validator(mode="after")
    def _one_document(self):
        if (self.document is None) == (self.document_id is None):
            raise ValueError("give either `document` (the text) or `document_id` (a stored document), not both")
        if self.document_id is not None:
            named = [f for f in SPLIT_FIELDS if getattr(self, f) is not None]
            if named:
                raise ValueError(f"{', '.join(named)}: a stored document keeps the passages it was cut into at upload")
        return self


class LoadedDocument(NamedTuple):
    text: str
    spans: list[dict]  # its passages'
    tokens: int
    warm: bool  # its passages' KV prefilled at upload


async def load_document(gateway, body: DocumentRequest, caller: Caller, span) -> LoadedDocument:
    """The document: stored, or cut now."""
    if body.document_id is None:
        split = await split_document(gateway, body, body.document, span)
        return LoadedDocument(body.document, passage_spans(split), split.total_tokens, False)
    try:
        found = await asyncio.to_thread(store_of(gateway).load, caller.tenant, body.document_id)
    except redis.RedisError as exc:
        raise store_unavailable(exc) from None
    if found is None:
        raise document_not_found(body.document_id, "document_id")
    meta, text = found
    return LoadedDocument(text, meta["passages"], meta["tokens"], meta.get("warm", False))
