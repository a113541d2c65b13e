"""Extraction with citations and warmed documents through a `k25 up` stack running SmolLM2:
every field extracted from the contract fixtures validates against the schema (checked by
`jsonschema`) and cites passages whose text holds its value; a field whose clause is removed
comes back null; the requests K25 cannot serve are 400s naming what is wrong; and a document
warmed at upload has its first question find its passages' KV cached.

SmolLM2 (135M) often misses a field, and may quote the wrong words of a passage it read: null is
a correct answer, and a value is only checked to stand in the passage it cites, never taken
on trust."""

import json
import re
import signal
import unicodedata
from decimal import Decimal

import httpx
import jsonschema
import pytest

from bench.document_extraction import REVIEW_SCHEMA
from tests.helpers.gateway_process import start_stack
from tests.helpers.paths import CONTRACTS

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
MAX_READS = 16  # the stack's --max-document-passages: fields x passages per field at most
CONTRACT = (CONTRACTS / "en_master_services_agreement.txt").read_text()
INTRO = next(line for line in CONTRACT.splitlines() if line.startswith("This Master Services Agreement"))
# parties, amounts, dates, notice period and governing law, as a contract review asks for them
SCHEMA = REVIEW_SCHEMA


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("extraction")
    service = start_stack(str(folder / "up.log"), "--model", MODEL, "--log-dir", str(folder),
                          f"--gateway-flag=--max-document-passages={MAX_READS}")
    yield service
    service.stop(signal.SIGINT)


def post(stack, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{stack.url}{path}", json=body, timeout=900)


def extract(stack, document: str, passages: int = 3, **more) -> dict:
    answer = post(stack, "/v1/documents/extract", {"model": MODEL, "document": document, "schema": SCHEMA,
                                                   "passages": passages, "passage_tokens": 256, **more})
    assert answer.status_code == 200, answer.text
    return answer.json()


def words(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def holds(passage_text: str, value) -> bool:
    """Whether the passage's text holds the value: each string in it (case and spaces aside), each
    number as written there (with or without thousands separators)."""
    if isinstance(value, list):
        return all(holds(passage_text, item) for item in value)
    if isinstance(value, str):
        return words(value).strip(" .,;:") in words(passage_text)
    return any(Decimal(n.replace(",", "")) == Decimal(str(value)) for n in re.findall(r"\d[\d,]*(?:\.\d+)?", passage_text))


def check_extraction(document: str, answer: dict) -> list[str]:
    """Every field validates and cites passages holding its value; the names of the fields found."""
    nullable = {**SCHEMA, "properties": {k: {"anyOf": [v, {"type": "null"}]} for k, v in SCHEMA["properties"].items()},
                "required": list(SCHEMA["properties"]), "additionalProperties": False}
    jsonschema.validate(answer["data"], nullable)
    found = []
    for name, field in answer["fields"].items():
        assert field["value"] == answer["data"][name]
        assert 1 <= len(field["passages_read"]) <= 3
        if field["value"] is None:
            assert field["citations"] == []
            continue
        found.append(name)
        jsonschema.validate(field["value"], SCHEMA["properties"][name])
        assert field["citations"], name
        read = {p["index"] for p in field["passages_read"]}
        for cited in field["citations"]:
            assert cited["index"] in read and cited["clause"]
            assert holds(document[cited["start_char"]:cited["end_char"]], field["value"]), (name, cited)
            leaves = field["value"] if isinstance(field["value"], list) else [field["value"]]
            assert len(cited["value_spans"]) == len(leaves)
            for (start, end), leaf in zip(cited["value_spans"], leaves):  # where each stands, inside the passage
                assert cited["start_char"] <= start < end <= cited["end_char"]
                assert words(document[start:end]) == words(leaf).strip(" .,;:")
    return found


def test_every_field_validates_and_cites_a_passage_that_holds_it(stack):
    answer = extract(stack, CONTRACT)
    assert answer["object"] == "document.extraction" and answer["chunks"] > 3
    found = check_extraction(CONTRACT, answer)
    assert "effective_date" in found and answer["data"]["effective_date"] == "April 2, 2024"
    [cited] = answer["fields"]["effective_date"]["citations"]
    [[start, end]] = cited["value_spans"]
    assert CONTRACT.index(INTRO) <= start < end <= CONTRACT.index(INTRO) + len(INTRO)
    assert answer["usage"]["prompt_tokens"] > 0 and answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_a_field_whose_clause_is_removed_comes_back_null(stack):
    without = CONTRACT.replace(INTRO + "\n", "")
    answer = extract(stack, without)
    check_extraction(without, answer)
    assert answer["data"]["effective_date"] is None and answer["fields"]["effective_date"]["citations"] == []


def test_a_chinese_contract_s_fields_validate_and_cite_what_holds_them(stack):
    document = (CONTRACTS / "zh_equity_transfer.txt").read_text()
    check_extraction(document, extract(stack, document, passages=1))


def test_a_stored_document_is_extracted_by_id_with_its_progress_streamed(stack):
    stored = post(stack, "/v1/documents", {"text": CONTRACT, "passage_tokens": 256}).json()
    body = {"model": MODEL, "document_id": stored["id"], "schema": SCHEMA, "passages": 2, "stream": True}
    with httpx.stream("POST", f"{stack.url}/v1/documents/extract", json=body, timeout=900) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    opening, *progress, result = [json.loads(e) for e in events[:-1]]
    assert opening["object"] == "document.passages" and set(opening["fields"]) == set(SCHEMA["properties"])
    assert [(e["read"], e["of"]) for e in progress] == [(n, 10) for n in range(1, 11)]  # 5 fields x 2 passages
    assert {e["field"] for e in progress} == set(SCHEMA["properties"])
    assert result["object"] == "document.extraction" and result["document_id"] == stored["id"]
    check_extraction(CONTRACT, result)


BAD = {"type": "object", "properties": {"law": {"type": "string"}}}


@pytest.mark.parametrize("change, status, code, named", [
    ({"schema": {"type": "array"}}, 400, "invalid_schema", "one property per field"),
    ({"schema": {"type": "object", "properties": {"renews": {"type": "boolean"}}}}, 400, "invalid_schema", "boolean"),
    ({"schema": {"type": "object", "properties": {f"f{i}": {"type": "string"} for i in range(33)}}}, 400,
     "invalid_schema", "at most 32"),
    ({"schema": {"type": "object", "properties": {"law": {"type": "string", "not": {}}}}}, 400, "invalid_schema", "'not'"),
    ({"schema": {"type": "object", "properties": {"law": {"$ref": "#/$defs/missing"}}}}, 400, "invalid_schema",
     "schema.properties.law"),
    ({"passages": 4, "schema": {"type": "object", "properties": {f"f{i}": {"type": "string"} for i in range(5)}}},
     400, "too_many_passages", f"at most {MAX_READS} passages in all (--max-document-passages)"),
    ({"document": None, "document_id": "doc-" + "0" * 24}, 404, "document_not_found", "doc-"),
    ({"model": "no-such-model"}, 404, "model_not_found", "no-such-model"),
])
def test_what_cannot_be_extracted_is_refused_before_any_engine_work(stack, change, status, code, named):
    body = {"model": MODEL, "document": "1.1 Law. Delaware.", "schema": BAD, "passages": 1, **change}
    refused = post(stack, "/v1/documents/extract", {k: v for k, v in body.items() if v is not None})
    assert refused.status_code == status and refused.json()["error"]["code"] == code and named in refused.text


def test_a_document_warmed_at_upload_has_its_first_question_find_its_passages_cached(stack):
    """The first question about a warmed document is read as notes (`auto`) and finds every
    passage it reads cached, up to the KV block that holds the question; about a document stored
    without warming, read together, only the prompt's opening (the same for every document) is."""
    question = {"model": MODEL, "question": "Which state's law governs the agreement?", "passages": 2,
                "max_tokens": 4, "note_max_tokens": 4}
    cached = {}
    for name, warm in (("en_master_services_agreement.txt", True), ("en_10k_risk_factors.txt", False)):
        stored = post(stack, "/v1/documents", {"text": (CONTRACTS / name).read_text(), "warm": warm}).json()
        if warm:
            assert stored["warmed"]["passages"] == len(stored["passages"])
            assert stored["warmed"]["usage"]["prompt_tokens"] > sum(p["tokens"] for p in stored["passages"])
        else:
            assert "warmed" not in stored
        assert stored["warm"] is warm and httpx.get(f"{stack.url}/v1/documents/{stored['id']}").json()["warm"] is warm
        answer = post(stack, "/v1/documents/ask", {**question, "document_id": stored["id"]}).json()
        assert answer["read"] == ("notes" if warm else "together")
        read = {p["index"] for p in answer["passages_read"]}
        read_tokens = sum(p["tokens"] for p in stored["passages"] if p["index"] + 1 in read)
        cached[warm] = (answer["usage"]["prompt_tokens_details"]["cached_tokens"], read_tokens)
    (warm_cached, warm_read), (cold_cached, cold_read) = cached[True], cached[False]
    slack = 64 * 2  # per passage read: the last, partly filled KV block and the prompt's own tokens
    assert warm_cached >= warm_read - slack
    assert cold_cached < cold_read - slack
