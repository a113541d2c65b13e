"""Documents stored once, per tenant, in the release's Redis (keys: common/document_keys.py).

A document is stored with the chunker's passages, so that a question by id neither sends the
text again nor cuts it again. Each is bounded in size, each tenant in bytes and in documents,
and each document expires. The tenant's limits are checked and the document written in one Lua
script, so that two uploads at once cannot both pass a limit only one fits.

The methods are blocking (one Redis round trip each): the routes run them in a thread."""

import json
import secrets
from dataclasses import dataclass

import redis

from common.document_keys import (
    document_key,
    document_key_prefix,
    document_tenants_key,
    is_document_id,
    tenant_documents_key,
)


@dataclass(frozen=True)
class StoreLimits:
    max_document_bytes: int  # a document's text, UTF-8
    max_tenant_bytes: int  # text and passages of all a tenant's documents
    max_tenant_documents: int
    ttl_s: int  # a document expires this long after its upload


class TenantLimitReached(Exception):
    """Storing the document would pass one of its tenant's limits ("bytes" or "documents")."""

    def __init__(self, limit: str, stored: int):
        super().__init__(limit)
        self.limit, self.stored = limit, stored


# KEYS: the tenant's index, the new document's key, the release's tenants. ARGV: id, bytes, max
# tenant bytes, max tenant documents, ttl, meta, text, the tenant's document key prefix, the
# tenant. Index entries of documents that expired are dropped as the tenant's use is counted.
_PUT = """
local entries = redis.call('HGETALL', KEYS[1])
local stored, count = 0, 0
for i = 1, #entries, 2 do
  if redis.call('EXISTS', ARGV[8] .. entries[i]) == 1 then
    stored = stored + tonumber(entries[i + 1])
    count = count + 1
  else
    redis.call('HDEL', KEYS[1], entries[i])
  end
end
if count + 1 > tonumber(ARGV[4]) then return {'documents', count} end
if stored + tonumber(ARGV[2]) > tonumber(ARGV[3]) then return {'bytes', stored} end
redis.call('HSET', KEYS[2], 'meta', ARGV[6], 'text', ARGV[7])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('SADD', KEYS[3], ARGV[9])
return {'ok', 0}
"""
# KEYS: the document's key, the tenant's index, the release's tenants. ARGV: id, the tenant.
# Whether there was a document; a tenant left with none leaves the release's tenants.
_DELETE = """
local removed = redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('SREM', KEYS[3], ARGV[2]) end
return removed
"""


def new_document_id() -> str:
    return "doc-" + secrets.token_hex(12)


class DocumentStore:
    def __init__(self, client: redis.Redis, release: str, limits: StoreLimits):
        self.redis, self.release, self.limits = client, release, limits
        self._put = client.register_script(_PUT)
        self._delete = client.register_script(_DELETE)

    def put(self, tenant: str, meta: dict, text: str) -> None:
        """Store a document (meta carries its id); raises TenantLimitReached past a tenant limit."""
        meta_json, text_bytes = json.dumps(meta, ensure_ascii=False), text.encode()
        size = len(meta_json.encode()) + len(text_bytes)
        answer = self._put(
            keys=[tenant_documents_key(self.release, tenant), document_key(self.release, tenant, meta["id"]),
                  document_tenants_key(self.release)],
            args=[meta["id"], size, self.limits.max_tenant_bytes, self.limits.max_tenant_documents, self.limits.ttl_s,
                  meta_json, text_bytes, document_key_prefix(self.release, tenant), tenant],
        )
        verdict, stored = answer[0].decode(), int(answer[1])
        if verdict != "ok":
            raise TenantLimitReached(verdict, stored)

    def meta(self, tenant: str, document_id: str) -> dict | None:
        """The document's meta, or None when this tenant has no document of that id."""
        if not is_document_id(document_id):
            return None
        found = self.redis.hget(document_key(self.release, tenant, document_id), "meta")
        return None if found is None else json.loads(found)

    def load(self, tenant: str, document_id: str) -> tuple[dict, str] | None:
        """The document's meta and text, or None."""
        if not is_document_id(document_id):
            return None
        meta, text = self.redis.hmget(document_key(self.release, tenant, document_id), ["meta", "text"])
        return None if meta is None or text is None else (json.loads(meta), text.decode())

    def delete(self, tenant: str, document_id: str) -> bool:
        """Remove the document's text, passages and index entry; whether there was one."""
        if not is_document_id(document_id):
            return False
        keys = [document_key(self.release, tenant, document_id), tenant_documents_key(self.release, tenant),
                document_tenants_key(self.release)]
        return self._delete(keys=keys, args=[document_id, tenant]) == 1

    def list(self, tenant: str) -> list[dict]:
        """The tenant's documents' meta, oldest first; index entries of expired ones are dropped."""
        index = tenant_documents_key(self.release, tenant)
        ids = [i.decode() for i in self.redis.hkeys(index)]
        with self.redis.pipeline(transaction=False) as pipe:
            for document_id in ids:
                pipe.hget(document_key(self.release, tenant, document_id), "meta")
            metas = pipe.execute()
        gone = [i for i, m in zip(ids, metas) if m is None]
        if gone:
            self.redis.hdel(index, *gone)
        return sorted((json.loads(m) for m in metas if m is not None), key=lambda m: (m["created"], m["id"]))

    def tenant_of(self, document_id: str) -> str | None:
        """The tenant that stores the document (for an admin key), or None."""
        if not is_document_id(document_id):
            return None
        tenants = sorted(t.decode() for t in self.redis.smembers(document_tenants_key(self.release)))
        with self.redis.pipeline(transaction=False) as pipe:
            for tenant in tenants:
                pipe.exists(document_key(self.release, tenant, document_id))
            found = pipe.execute()
        return next((tenant for tenant, exists in zip(tenants, found) if exists), None)

    def list_every_tenant(self) -> "list[tuple[str, dict]]":
        """(tenant, meta) of every tenant's documents (for an admin key), oldest first."""
        tenants = sorted(t.decode() for t in self.redis.smembers(document_tenants_key(self.release)))
        found = [(tenant, meta) for tenant in tenants for meta in self.list(tenant)]
        return sorted(found, key=lambda pair: (pair[1]["created"], pair[1]["id"]))
