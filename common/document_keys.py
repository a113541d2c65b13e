"""The Redis contract for stored documents (`POST /v1/documents`), written and read by the gateways.

Every key starts with the release name, as in `common.redis_keys`. A document belongs to one
tenant, and the tenant is part of its key, so that no id can reach another tenant's document:

    {release}:document:{tenant}:{document_id}   hash, expires document_ttl_s after upload
        meta    JSON: id, name, metadata, created, expires_at, bytes, passage settings and
                the chunker's passages (character and token spans, anchor) with their token counts
        text    the document's text (UTF-8)

    {release}:documents:{tenant}                 hash: document_id -> bytes stored for it
                                                 (text + meta); the tenant's index, so that listing
                                                 and the tenant's limits take no keyspace SCAN.
                                                 Entries whose document expired are dropped when
                                                 the index is next read.

    {release}:document-tenants                   set: the tenants that store documents, so that an
                                                 admin key may list every tenant's documents and
                                                 find one by id without a keyspace SCAN. A tenant
                                                 leaves it when its last document is deleted.

A document id is `doc-` and 24 hex digits; anything else names no document.
"""

import re

DOCUMENT_ID = re.compile(r"doc-[0-9a-f]{24}")


def document_key(release: str, tenant: str, document_id: str) -> str:
    return f"{release}:document:{tenant}:{document_id}"


def document_key_prefix(release: str, tenant: str) -> str:
    return f"{release}:document:{tenant}:"


def tenant_documents_key(release: str, tenant: str) -> str:
    return f"{release}:documents:{tenant}"


def document_tenants_key(release: str) -> str:
    return f"{release}:document-tenants"


def is_document_id(text: str) -> bool:
    return DOCUMENT_ID.fullmatch(text) is not None
