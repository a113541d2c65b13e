"""Stored documents through a `k25 up` stack (tiny model, real chunker, its own Redis) with API
keys of six tenants and an admin: upload, read, list and delete by tenant; another tenant's id
is a 404, except to the admin key, which sees every tenant's; the limits answered as OpenAI
errors that name them; questions by id read the passages chosen for them and say which."""

import json
import re
import signal

import httpx
import pytest

from common.document_keys import document_key, tenant_documents_key
from common.redis_keys import live_engines
from services.gateway.api_keys import hash_key
from tests.helpers.gateway_process import start_stack
from tests.helpers.paths import CONTRACTS
from tests.helpers.up_stack import UP_RELEASE, redis_client

CONTRACT = CONTRACTS / "en_master_services_agreement.txt"
LONG_CONTRACT = CONTRACTS / "en_supply_agreement.txt"
TENANTS = ("acme", "globex", "few", "small", "thrifty", "initech")
LIMITS = ("--gateway-flag=--max-document-bytes=30000", "--gateway-flag=--max-tenant-documents=2",
          "--gateway-flag=--max-tenant-document-bytes=25000")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stored-documents")
    keys = folder / "keys.json"
    entries = [{"sha256": hash_key(f"key-{t}"), "tenant": t} for t in TENANTS]
    entries.append({"sha256": hash_key("key-admin"), "tenant": "compliance", "admin": True})
    keys.write_text(json.dumps({"keys": entries,
                                "tenants": {"thrifty": {"tokens_per_minute": 100}}}))
    service = start_stack(str(folder / "up.log"), "--model", "tiny-random", "--log-dir", str(folder),
                          "--api-keys-file", str(keys), *LIMITS)
    yield service
    service.stop(signal.SIGINT)


def call(stack, method: str, path: str, tenant: str, body: dict | None = None) -> httpx.Response:
    return httpx.request(method, f"{stack.url}{path}", json=body, timeout=120,
                         headers={"Authorization": f"Bearer key-{tenant}"})


def upload(stack, tenant: str, text: str, **fields) -> httpx.Response:
    return call(stack, "POST", "/v1/documents", tenant, {"text": text, **fields})


def engine_requests(stack) -> float:
    text = httpx.get(f"{stack.url}/metrics").text
    return sum(float(v) for v in re.findall(r'^k25_gateway_requests_total\{pool="default",status="200"\} (\S+)$', text, re.M))


def test_a_document_is_stored_with_its_passages_and_shown_listed_and_deleted_by_its_tenant(stack):
    text = CONTRACT.read_text()
    created = upload(stack, "acme", text, name="msa.txt", metadata={"matter": "M-17"}, passage_tokens=256)
    assert created.status_code == 200
    document = created.json()
    chunks = call(stack, "POST", "/v1/chunks", "acme", {"text": text, "passage_tokens": 256}).json()["data"]
    assert document["passages"] == chunks  # the chunker's passages, kept with their token counts
    assert all(p["tokens"] == p["end_token"] - p["start_token"] > 0 for p in document["passages"])
    assert (document["name"], document["metadata"], document["bytes"]) == ("msa.txt", {"matter": "M-17"}, len(text.encode()))
    assert document["tenant"] == "acme"
    assert document["object"] == "document" and document["expires_at"] > document["created"]

    assert call(stack, "GET", f"/v1/documents/{document['id']}", "acme").json() == document
    listed = call(stack, "GET", "/v1/documents", "acme").json()["data"]
    assert [d["id"] for d in listed] == [document["id"]] and "passages" not in listed[0]
    assert listed[0]["passage_count"] == len(chunks)

    deleted = call(stack, "DELETE", f"/v1/documents/{document['id']}", "acme")
    assert deleted.json() == {"id": document["id"], "object": "document.deleted", "deleted": True}
    client = redis_client(stack)
    assert not client.exists(document_key(UP_RELEASE, "acme", document["id"]))
    assert not client.hexists(tenant_documents_key(UP_RELEASE, "acme"), document["id"])
    assert call(stack, "GET", f"/v1/documents/{document['id']}", "acme").status_code == 404


def test_another_tenant_s_document_is_a_404_and_absent_from_its_list(stack):
    document = upload(stack, "acme", "1.1 Fees. Fees are due monthly.").json()
    ask = {"model": "tiny-random", "document_id": document["id"], "question": "q", "max_tokens": 2}
    for method, path, body in (("GET", f"/v1/documents/{document['id']}", None),
                               ("DELETE", f"/v1/documents/{document['id']}", None),
                               ("POST", "/v1/documents/ask", ask)):
        refused = call(stack, method, path, "globex", body)
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "document_not_found"
    assert call(stack, "GET", "/v1/documents", "globex").json()["data"] == []
    assert call(stack, "GET", f"/v1/documents/{document['id']}", "acme").status_code == 200


def test_an_admin_key_lists_shows_and_deletes_every_tenant_s_documents(stack):
    mine, theirs = (upload(stack, tenant, f"1.1 Term. {tenant}").json() for tenant in ("initech", "globex"))
    listed = {d["id"]: d["tenant"] for d in call(stack, "GET", "/v1/documents", "admin").json()["data"]}
    assert listed[mine["id"]] == "initech" and listed[theirs["id"]] == "globex"
    assert call(stack, "GET", f"/v1/documents/{theirs['id']}", "admin").json() == theirs
    deleted = call(stack, "DELETE", f"/v1/documents/{theirs['id']}", "admin")
    assert deleted.status_code == 200 and call(stack, "GET", f"/v1/documents/{theirs['id']}", "globex").status_code == 404
    assert not redis_client(stack).exists(document_key(UP_RELEASE, "globex", theirs["id"]))
    # other keys stay in their tenant, an admin's questions too
    assert theirs["id"] not in [d["id"] for d in call(stack, "GET", "/v1/documents", "globex").json()["data"]]
    assert mine["id"] not in [d["id"] for d in call(stack, "GET", "/v1/documents", "globex").json()["data"]]
    assert call(stack, "GET", f"/v1/documents/{mine['id']}", "globex").status_code == 404
    ask = {"model": "tiny-random", "document_id": mine["id"], "question": "q", "max_tokens": 2}
    assert call(stack, "POST", "/v1/documents/ask", "admin", ask).status_code == 404
    assert call(stack, "GET", f"/v1/documents/{'doc-' + '0' * 24}", "admin").status_code == 404


def test_a_question_by_id_reads_the_passages_chosen_for_it_and_says_which(stack):
    text = CONTRACT.read_text()
    document = upload(stack, "acme", text, passage_tokens=256).json()
    before = engine_requests(stack)
    body = {"model": "tiny-random", "document_id": document["id"], "question": "Which state's law governs the agreement?",
            "passages": 2, "max_tokens": 4, "note_max_tokens": 2, "read": "notes"}
    answer = call(stack, "POST", "/v1/documents/ask", "acme", body).json()
    assert answer["document_id"] == document["id"] and answer["chunks"] == len(document["passages"]) > 2
    read = answer["passages_read"]
    assert len(read) == 2 and "9.1 Governing Law" in text[read[0]["start_char"]:read[0]["end_char"]]
    assert answer["read"] == "notes"
    assert engine_requests(stack) - before == 2 + 1  # a note per passage read, then the answer


def test_a_question_whose_passages_fit_reads_them_together_in_one_engine_request(stack):
    text = CONTRACT.read_text()
    document = upload(stack, "initech", text, passage_tokens=256).json()
    body = {"model": "tiny-random", "document_id": document["id"], "question": "Which state's law governs the agreement?",
            "passages": 3, "max_tokens": 4}
    before = engine_requests(stack)
    answer = call(stack, "POST", "/v1/documents/ask", "initech", body).json()
    assert answer["read"] == "together" and engine_requests(stack) - before == 1
    read = {p["index"] for p in answer["passages_read"]}
    assert len(read) == 3 and answer["citations"] and {c["index"] for c in answer["citations"]} <= read
    assert answer["notes_left_out"] == 0 and answer["usage"]["completion_tokens"] > 0

    with httpx.stream("POST", f"{stack.url}/v1/documents/ask", json={**body, "stream": True}, timeout=120,
                      headers={"Authorization": "Bearer key-initech"}) as response:
        events = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    opening, answer_events, closing = events[0], events[1:-1], events[-1]
    assert opening == {"object": "document.passages", "passages_read": answer["passages_read"], "read": "together"}
    assert answer_events and all(e["object"] == "chat.completion.chunk" for e in answer_events)  # no notes to report
    assert closing["object"] == "document.citations" and closing["read"] == "together"
    assert {c["index"] for c in closing["citations"]} <= read

    assert call(stack, "DELETE", f"/v1/documents/{document['id']}", "initech").status_code == 200


def test_passages_past_the_context_are_read_as_notes_and_refused_together(stack):
    """Every passage of a 50 KB contract (11,482 tokens) does not fit the model's context beside
    the answer: `auto` takes notes, `together` is a 400 before any engine work."""
    context = max(entry["max_model_len"] for entry in live_engines(redis_client(stack), UP_RELEASE).values())
    every = {"model": "tiny-random", "document": LONG_CONTRACT.read_text(), "question": "Who are the parties?",
             "passages": 256, "note_max_tokens": 1, "max_tokens": 1}
    chunks = call(stack, "POST", "/v1/chunks", "initech", {"text": every["document"]}).json()
    assert chunks["total_tokens"] > context
    before = engine_requests(stack)
    refused = call(stack, "POST", "/v1/documents/ask", "initech", {**every, "read": "together"})
    error = refused.json()["error"]
    assert refused.status_code == 400 and (error["code"], error["param"]) == ("context_length_exceeded", "read")
    assert engine_requests(stack) == before
    answer = call(stack, "POST", "/v1/documents/ask", "initech", every).json()
    assert answer["read"] == "notes" and len(answer["passages_read"]) == len(chunks["data"])
    assert engine_requests(stack) - before == len(chunks["data"]) + 1


@pytest.mark.parametrize("body, status, code, named", [
    ({"text": "x" * 30001}, 413, "document_too_large", "--max-document-bytes"),
    ({"text": "x", "metadata": {str(i): "v" for i in range(17)}}, 400, None, "metadata"),
    ({"text": ""}, 400, None, "text"),
])
def test_upload_errors(stack, body, status, code, named):
    refused = upload(stack, "acme", **body)
    assert refused.status_code == status and named in refused.text
    assert code is None or refused.json()["error"]["code"] == code


def test_a_tenant_past_its_document_count_gets_400_naming_the_limit(stack):
    assert [upload(stack, "few", "1.1 Term.").status_code for _ in range(2)] == [200, 200]
    refused = upload(stack, "few", "1.1 Term.")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "too_many_documents"
    assert "--max-tenant-documents 2" in refused.json()["error"]["message"]


def test_a_tenant_past_its_bytes_gets_413_naming_the_limit(stack):
    assert upload(stack, "small", CONTRACT.read_text()).status_code == 200
    refused = upload(stack, "small", CONTRACT.read_text())
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "tenant_storage_full"
    assert "--max-tenant-document-bytes" in refused.json()["error"]["message"]


@pytest.mark.parametrize("body, status, param", [
    ({"question": "q"}, 400, "document_id"),
    ({"question": "q", "document": "x", "document_id": "doc-" + "0" * 24}, 400, "document_id"),
    ({"question": "q", "document_id": "doc-" + "0" * 24, "passage_tokens": 64}, 400, "passage_tokens"),
    ({"question": "q", "document_id": "doc-" + "0" * 24}, 404, "document_id"),
    ({"question": "q", "document_id": "../etc"}, 404, "document_id"),
])
def test_ask_by_id_errors(stack, body, status, param):
    refused = call(stack, "POST", "/v1/documents/ask", "acme", {"model": "tiny-random", "max_tokens": 2, **body})
    assert refused.status_code == status and param in refused.text


def test_an_upload_is_charged_to_the_tenant_s_token_rate(stack):
    refused = upload(stack, "thrifty", CONTRACT.read_text())
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert call(stack, "GET", "/v1/documents", "thrifty").json()["data"] == []
