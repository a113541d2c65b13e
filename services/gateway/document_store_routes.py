"""`/v1/documents`: a tenant's stored documents. `POST` cuts the text into passages (the chunker),
optionally warms their KV on the engines (document_warm.py), and stores both (document_store.py);
`GET` lists the tenant's documents, `GET /{id}` shows one with its passages, `DELETE /{id}`
removes it. Another tenant's id answers 404, as an id that
never existed does; an admin key (api_keys.py) lists, shows and deletes every tenant's."""

import asyncio
import logging
import time

import redis
from fastapi import Depends, FastAPI, Request
from pydantic import Field, field_validator

from services.gateway.api_keys import Caller
from services.gateway.disconnect import unless_client_leaves
from services.gateway.document_split import SplitFields, passage_spans, split_document
from services.gateway.document_store import DocumentStore, StoreLimits, TenantLimitReached, new_document_id
from services.gateway.document_warm import warm_cost, warm_passages
from services.gateway.documents import passages_of
from services.gateway.errors import RETRY_AFTER_S, OpenAIError, invalid_request
from services.gateway.openai_schema import estimated_tokens
from services.gateway.request_id import current_request_id

log = logging.getLogger(__name__)

# OpenAI's own bounds on `metadata`
METADATA_KEYS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


class DocumentCreate(SplitFields):
    text: str = Field(min_length=1, description="the document's text")
    name: str | None = Field(None, max_length=256, description="a name to know it by, e.g. its file name")
    metadata: dict[str, str] = Field(default_factory=dict, description=f"up to {METADATA_KEYS} string pairs kept with "
                                     f"it (keys up to {METADATA_KEY_CHARS} characters, values {METADATA_VALUE_CHARS})")

    @field_validator("metadata")
    @classmethod
    def _bounded(cls, metadata: dict[str, str]) -> dict[str, str]:
        if len(metadata) > METADATA_KEYS:
            raise ValueError(f"at most {METADATA_KEYS} metadata keys")
        for key, value in metadata.items():
            if len(key) > METADATA_KEY_CHARS or len(value) > METADATA_VALUE_CHARS:
                raise ValueError(f"metadata keys have at most {METADATA_KEY_CHARS} characters and values "
                                 f"{METADATA_VALUE_CHARS}")
        return metadata

    warm: bool = Field(False, description="prefill every passage's KV on the engines (for the base model) before "
                       "answering, so that the first question about it is fast too")


def store_of(gateway) -> DocumentStore:
    """The gateway's document store, made on first use."""
    store = getattr(gateway, "document_store", None)
    if store is None:
        s = gateway.settings
        store = DocumentStore(gateway.redis, s.release, StoreLimits(s.max_document_bytes, s.max_tenant_document_bytes,
                                                                    s.max_tenant_documents, s.document_ttl_s))
        gateway.document_store = store
    return store


def document_not_found(document_id: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(404, f"no document {document_id!r}", "invalid_request_error", "document_not_found", param)


def store_unavailable(exc: redis.RedisError) -> OpenAIError:
    log.error("request %s: document store: %s", current_request_id(), exc)
    return OpenAIError(503, "the document store (Redis) cannot be reached; try again", "server_error",
                       "document_store_unavailable", headers={"Retry-After": str(RETRY_AFTER_S)})


def too_large(text_bytes: int, limit: int) -> OpenAIError | None:
    if text_bytes <= limit:
        return None
    return OpenAIError(413, f"the document's text is {text_bytes} bytes; a document may have at most {limit} "
                       f"(--max-document-bytes)", "invalid_request_error", "document_too_large", "text")


def tenant_limit_error(reached: TenantLimitReached, adding: int, settings) -> OpenAIError:
    if reached.limit == "documents":
        return invalid_request(f"this tenant stores {reached.stored} documents, the most it may "
                               f"(--max-tenant-documents {settings.max_tenant_documents}); delete one first",
                               None, "too_many_documents")
    return OpenAIError(413, f"this tenant stores {reached.stored} bytes; {adding} more would pass its limit of "
                       f"{settings.max_tenant_document_bytes} (--max-tenant-document-bytes); delete documents first",
                       "invalid_request_error", "tenant_storage_full")


def public(meta: dict, tenant: str, with_passages: bool) -> dict:
    """A document as answered: its meta and tenant, with its passages or only their number."""
    shown = {k: v for k, v in meta.items() if k != "passages"} | {"tenant": tenant}
    shown["passage_count"] = len(meta["passages"])
    if with_passages:
        shown["passages"] = meta["passages"]
    return shown


def install_document_store_routes(app: FastAPI, gateway, caller) -> None:
    async def in_store(method, *args):
        try:
            return await asyncio.to_thread(method, *args)
        except redis.RedisError as exc:
            raise store_unavailable(exc) from None

    async def tenant_of(caller: Caller, document_id: str) -> str:
        """Whose document the caller names: its own tenant's, or for an admin key any tenant's."""
        if not caller.admin:
            return caller.tenant
        return await in_store(store_of(gateway).tenant_of, document_id) or caller.tenant

    @app.post("/v1/documents")
    async def create(body: DocumentCreate, request: Request, caller: Caller = Depends(caller)):
        refusal = too_large(len(body.text.encode()), gateway.settings.max_document_bytes)
        if refusal is not None:
            raise refusal
        return await unless_client_leaves(request, store_document(body, request, caller))

    async def store_document(body: DocumentCreate, request: Request, caller: Caller):
        settings = gateway.settings
        # cutting is charged to the tenant's token rate as the text's tokens, as /v1/chunks is
        ticket = request.state.ticket
        ticket.reserve(estimated_tokens(body.text))
        split = await split_document(gateway, body, body.text, request.state.span)
        ticket.use(split.total_tokens)
        spans = passage_spans(split)
        warmed = None
        if body.warm:  # before it is stored: a warm-up that fails leaves nothing stored
            ticket.reserve(warm_cost([s["tokens"] for s in spans]))
            warmed = await warm_passages(gateway, passages_of(body.text, spans), caller, ticket, request.state.span)
        created = int(time.time())
        meta = {"id": new_document_id(), "object": "document", "name": body.name, "metadata": body.metadata,
                "created": created, "expires_at": created + settings.document_ttl_s, "bytes": len(body.text.encode()),
                "tokens": split.total_tokens, "passage_tokens": body.passage_tokens,
                "overlap_ratio": body.overlap_ratio, "semantic_threshold": body.semantic_threshold,
                "warm": body.warm, "passages": spans}
        try:
            await in_store(store_of(gateway).put, caller.tenant, meta, body.text)
        except TenantLimitReached as reached:
            raise tenant_limit_error(reached, meta["bytes"], settings) from None
        shown = public(meta, caller.tenant, with_passages=True)
        return shown | {"warmed": warmed} if warmed is not None else shown

    @app.get("/v1/documents")
    async def listing(caller: Caller = Depends(caller)):
        store = store_of(gateway)
        found = await in_store(store.list_every_tenant) if caller.admin else \
            [(caller.tenant, meta) for meta in await in_store(store.list, caller.tenant)]
        return {"object": "list", "data": [public(meta, tenant, with_passages=False) for tenant, meta in found]}

    @app.get("/v1/documents/{document_id}")
    async def show(document_id: str, caller: Caller = Depends(caller)):
        tenant = await tenant_of(caller, document_id)
        meta = await in_store(store_of(gateway).meta, tenant, document_id)
        if meta is None:
            raise document_not_found(document_id)
        return public(meta, tenant, with_passages=True)

    @app.delete("/v1/documents/{document_id}")
    async def delete(document_id: str, caller: Caller = Depends(caller)):
        if not await in_store(store_of(gateway).delete, await tenant_of(caller, document_id), document_id):
            raise document_not_found(document_id)
        return {"id": document_id, "object": "document.deleted", "deleted": True}
