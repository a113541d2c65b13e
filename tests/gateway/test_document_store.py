"""The document store on a real Redis: a tenant's documents stored, read, listed and deleted;
other tenants see none of them; the tenant limits; expiry; the keys it leaves behind."""

import pytest
import redis

from common.document_keys import document_key, document_tenants_key, is_document_id, tenant_documents_key
from services.gateway.document_store import DocumentStore, StoreLimits, TenantLimitReached, new_document_id
from tests.helpers.redis_server import redis_server  # noqa: F401  (fixture)

LIMITS = StoreLimits(max_document_bytes=1000, max_tenant_bytes=2000, max_tenant_documents=3, ttl_s=3600)


@pytest.fixture
def client(redis_server):  # noqa: F811
    return redis.Redis.from_url(redis_server)


def meta(created: int = 1, passages: int = 2) -> dict:
    return {"id": new_document_id(), "created": created, "name": "msa.txt",
            "passages": [{"index": i, "start_char": i, "end_char": i + 1} for i in range(passages)]}


def test_a_stored_document_is_read_back_by_its_tenant_only(client):
    store = DocumentStore(client, "rel", LIMITS)
    stored = meta()
    store.put("acme", stored, "Clause 1. 条款")
    assert store.meta("acme", stored["id"]) == stored
    assert store.load("acme", stored["id"]) == (stored, "Clause 1. 条款")
    assert store.meta("globex", stored["id"]) is None and store.load("globex", stored["id"]) is None
    assert [m["id"] for m in store.list("acme")] == [stored["id"]] and store.list("globex") == []
    assert not store.delete("globex", stored["id"]) and store.meta("acme", stored["id"]) == stored


def test_an_id_not_of_the_id_form_names_no_document(client):
    store = DocumentStore(client, "rel", LIMITS)
    assert is_document_id(new_document_id()) and not is_document_id("doc-1") and not is_document_id("*")
    assert store.meta("acme", "*") is None and store.load("acme", "../x") is None and not store.delete("acme", "*")


def test_a_deleted_document_leaves_nothing_in_redis(client):
    store = DocumentStore(client, "rel", LIMITS)
    stored = meta()
    store.put("acme", stored, "text")
    assert store.delete("acme", stored["id"])
    assert client.keys("*") == [] and store.list("acme") == [] and not store.delete("acme", stored["id"])


def test_documents_are_listed_oldest_first(client):
    store = DocumentStore(client, "rel", LIMITS)
    late, early = meta(created=20), meta(created=10)
    store.put("acme", late, "b")
    store.put("acme", early, "a")
    assert [m["id"] for m in store.list("acme")] == [early["id"], late["id"]]


def test_a_document_and_the_tenant_index_expire_after_the_ttl(client):
    store = DocumentStore(client, "rel", LIMITS)
    stored = meta()
    store.put("acme", stored, "text")
    for key in (document_key("rel", "acme", stored["id"]), tenant_documents_key("rel", "acme")):
        assert 0 < client.ttl(key) <= LIMITS.ttl_s


def test_the_tenant_s_document_count_is_bounded_and_expired_ones_free_their_place(client):
    store = DocumentStore(client, "rel", LIMITS)
    kept = [meta() for _ in range(3)]
    for m in kept:
        store.put("acme", m, "x")
    with pytest.raises(TenantLimitReached) as refused:
        store.put("acme", meta(), "x")
    assert (refused.value.limit, refused.value.stored) == ("documents", 3)
    store.put("globex", meta(), "x")  # another tenant's count is its own
    client.delete(document_key("rel", "acme", kept[0]["id"]))  # what its expiry does
    store.put("acme", meta(), "x")
    assert len(store.list("acme")) == 3 and kept[0]["id"] not in client.hkeys(tenant_documents_key("rel", "acme"))


def test_the_tenant_s_bytes_are_bounded_counting_text_and_passages(client):
    store = DocumentStore(client, "rel", LIMITS)
    store.put("acme", meta(), "x" * 900)
    with pytest.raises(TenantLimitReached) as refused:
        store.put("acme", meta(), "y" * 900)
    assert refused.value.limit == "bytes" and refused.value.stored > 900
    assert len(store.list("acme")) == 1  # nothing of the refused document was written
    store.put("acme", meta(), "z" * 500)


def test_an_admin_finds_every_tenant_s_documents_and_a_tenant_leaves_with_its_last(client):
    store = DocumentStore(client, "rel", LIMITS)
    acme, globex, later = meta(created=2), meta(created=1), meta(created=3)
    store.put("acme", acme, "a")
    store.put("globex", globex, "g")
    store.put("acme", later, "l")
    assert [(t, m["id"]) for t, m in store.list_every_tenant()] == [
        ("globex", globex["id"]), ("acme", acme["id"]), ("acme", later["id"])]
    assert store.tenant_of(acme["id"]) == "acme" and store.tenant_of(globex["id"]) == "globex"
    assert store.tenant_of(new_document_id()) is None and store.tenant_of("*") is None
    store.delete("globex", globex["id"])
    assert client.smembers(document_tenants_key("rel")) == {b"acme"}
    store.delete("acme", acme["id"])
    assert client.smembers(document_tenants_key("rel")) == {b"acme"}  # it still stores one
