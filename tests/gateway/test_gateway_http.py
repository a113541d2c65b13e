"""The gateway's HTTP edge in-process (no engine is needed for these paths): API keys,
request validation and body limits, all answered in OpenAI's error shape; what fails inside
stays in the log, and the client gets a request id to quote."""

import asyncio
import json
import logging

import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client import Histogram

from common.tokenizer import load_tokenizer
from proto import k25_pb2
from services.gateway.api_keys import ApiKeys, Caller, hash_key
from services.gateway.app import create_app
from services.gateway.errors import OpenAIError, from_engine_error
from services.gateway.openai_schema import FLOAT32_TINY, ChatCompletionRequest, lone_surrogate_at
from services.gateway.prompt_encoder import PromptEncoder
from services.gateway.service import Gateway
from services.gateway.settings import GatewaySettings
from services.gateway.tenant_limits import TenantLimits
from tests.helpers.redis_server import free_port, module_redis_url  # noqa: F401  (fixture)

KEY = "k25-test-key"


@pytest.fixture(scope="module")
def client(module_redis_url):  # noqa: F811
    settings = GatewaySettings(model="tiny-random", redis_url=module_redis_url, max_body_bytes=4096, max_tokens_limit=100,
                               engine_wait_s=0)  # no engine ever comes here: answer at once
    gateway = Gateway(settings, load_tokenizer("tiny-random"), redis.Redis.from_url(module_redis_url))
    app = create_app(gateway, ApiKeys({hash_key(KEY): Caller("acme", key_id=hash_key(KEY))}))
    with TestClient(app) as test_client:
        yield test_client


AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}]}


def assert_openai_error(response, status: int, code: str | None = None, param: str | None = None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                                     {"Authorization": "Basic " + KEY}])
def test_missing_or_wrong_keys_get_401(client, headers):
    assert_openai_error(client.post("/v1/chat/completions", json=CHAT, headers=headers), 401, "invalid_api_key")
    assert_openai_error(client.get("/v1/models", headers=headers), 401, "invalid_api_key")


def test_a_good_key_passes(client):
    assert client.get("/v1/models", headers=AUTH).json()["data"][0]["id"] == "tiny-random"


def test_health_needs_no_key_and_readiness_tells_the_truth(client):
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    # ready to serve (a request would wait for an engine), and it says none has registered
    assert ready.status_code == 200 and ready.json()["ready"] and ready.json()["engines"] == 0


def test_no_engine_is_503_with_retry_after(client):
    response = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert_openai_error(response, 503, "no_engine_available")
    assert response.headers["retry-after"] == "1"


@pytest.mark.parametrize("body, param", [
    ({"model": "tiny-random"}, "messages"),
    ({**CHAT, "messages": []}, "messages"),
    ({**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({**CHAT, "max_tokens": 0}, "max_tokens"),
    ({**CHAT, "max_tokens": 101}, "max_tokens"),
    ({**CHAT, "top_p": 0}, "top_p"),
    ({**CHAT, "n": 3}, "n"),
    ({**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({**CHAT, "presence_penalty": 0.5}, "presence_penalty"),
    ({**CHAT, "top_k": 2**31}, "top_k"),  # beyond the wire's int32 (found by the fuzz test: it was a 500)
])
def test_bad_chat_requests_get_400_naming_the_field(client, body, param):
    assert_openai_error(client.post("/v1/chat/completions", json=body, headers=AUTH), 400, param=param)


@pytest.mark.parametrize("prompt", ["", [], [["a"]], ["a", "b"], [10**9]])
def test_bad_prompts_get_400(client, prompt):
    body = {"model": "tiny-random", "prompt": prompt}
    assert_openai_error(client.post("/v1/completions", json=body, headers=AUTH), 400)


@pytest.mark.parametrize("prompt", [["a", "b"], [[1], [2]]])
def test_batches_of_prompts_get_400_saying_so(client, prompt):
    response = client.post("/v1/completions", json={"model": "tiny-random", "prompt": prompt}, headers=AUTH)
    error = assert_openai_error(response, 400)
    assert "one prompt per request" in error["message"]


ASK = {"model": "tiny-random", "document": "Article 1.", "question": "q"}


@pytest.mark.parametrize("path, extra", [("/v1/chunks", {"text": "Article 1."}), ("/v1/documents/ask", ASK)])
def test_a_passage_budget_beyond_the_chunker_s_is_400(client, path, extra):
    """Found by the fuzz test: one beyond the wire's uint32 failed building the chunker's request (a 500)."""
    assert_openai_error(client.post(path, json={**extra, "passage_tokens": 2**33}, headers=AUTH), 400, param="passage_tokens")


LONE = "\ud800"  # JSON can spell it; UTF-8, protobuf and the tokenizer cannot


@pytest.mark.parametrize("path, body, where", [
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "hi " + LONE}]}, "messages[0].content"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]},
     "messages[0].content[0].text"),
    ("/v1/chat/completions", {**CHAT, "stop": LONE}, "stop"),
    ("/v1/chat/completions", {**CHAT, "stop": ["ok", "\udfff"]}, "stop[1]"),
    ("/v1/chat/completions", {**CHAT, "user": LONE}, "user"),
    ("/v1/chat/completions", {**CHAT, "metadata": {LONE: 1}}, "a key of metadata"),
    ("/v1/completions", {"model": "tiny-random", "prompt": "a" + LONE + "b"}, "prompt"),
    ("/v1/chunks", {"text": "Article 1. " + LONE}, "text"),
    ("/v1/documents/ask", {**ASK, "document": LONE}, "document"),
    ("/v1/documents/ask", {**ASK, "question": LONE}, "question"),
])
def test_lone_surrogates_anywhere_in_a_body_get_400_naming_where(client, path, body, where):
    encoded = json.dumps(body).encode()  # ASCII JSON with \ud800 escapes, as a hostile client sends it
    response = client.post(path, content=encoded, headers={**AUTH, "Content-Type": "application/json"})
    error = assert_openai_error(response, 400)
    assert error["message"].startswith(f"{where} holds a lone surrogate"), error["message"]


def test_paired_surrogates_are_text():
    """An astral character arrives as a surrogate pair in JSON, and is one code point once decoded."""
    assert lone_surrogate_at(json.loads('{"content": "\\ud83d\\ude00"}')) is None


def test_a_top_p_below_float32_is_raised_to_the_smallest_the_engine_reads():
    request = ChatCompletionRequest(**CHAT, top_p=1e-50)
    assert request.top_p == FLOAT32_TINY
    assert k25_pb2.SamplingParams(top_p=request.top_p).top_p > 0  # float32 on the wire: not 0, "off"
    assert k25_pb2.SamplingParams(top_p=1e-50).top_p == 0  # what reached the engine before
    assert ChatCompletionRequest(**CHAT, top_p=0.5).top_p == 0.5


def test_unknown_model_is_404(client):
    assert_openai_error(client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-5"}, headers=AUTH), 404,
                        "model_not_found", "model")


def test_not_json_is_400(client):
    response = client.post("/v1/completions", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"})
    assert_openai_error(response, 400)


def test_unknown_path_is_404_in_openai_shape(client):
    assert_openai_error(client.get("/v1/nothing", headers=AUTH), 404)


def test_body_over_the_limit_is_413_with_or_without_content_length(client):
    big = json.dumps({**CHAT, "padding": "x" * 5000}).encode()
    assert_openai_error(client.post("/v1/chat/completions", content=big, headers=AUTH), 413, "request_too_large")

    def chunks():  # no Content-Length: sent chunked
        for start in range(0, len(big), 1000):
            yield big[start:start + 1000]

    assert_openai_error(client.post("/v1/chat/completions", content=chunks(), headers=AUTH), 413, "request_too_large")
    small = json.dumps(CHAT).encode()
    response = client.post("/v1/chat/completions", content=iter([small[:10], small[10:]]),
                           headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 503  # read whole, parsed, and only then refused for want of engines


def test_cutting_a_document_is_charged_to_the_tenants_token_rate(module_redis_url):  # noqa: F811
    """Before the chunker is asked: a text larger than the tenant's rate can pay is 429 (here no
    chunker is set, so a text within it reaches the 503 that says so)."""
    settings = GatewaySettings(model="tiny-random", redis_url=module_redis_url, engine_wait_s=0)
    gateway = Gateway(settings, load_tokenizer("tiny-random"), redis.Redis.from_url(module_redis_url))
    keys = ApiKeys({hash_key(KEY): Caller("acme", key_id=hash_key(KEY))}, {"acme": TenantLimits(tokens_per_minute=50)})
    with TestClient(create_app(gateway, keys)) as client:
        response = client.post("/v1/chunks", json={"text": "Article 1. Terms. " * 40}, headers=AUTH)
        assert response.status_code == 429 and response.json()["error"]["code"] == "rate_limit_exceeded"
        assert client.post("/v1/chunks", json={"text": "Article 1."}, headers=AUTH).status_code == 503


def test_without_a_chunker_document_routes_are_503(client):
    response = client.post("/v1/chunks", json={"text": "Article 1. Terms."}, headers=AUTH)
    assert_openai_error(response, 503, "chunker_unavailable")
    body = {"model": "tiny-random", "document": "Article 1. Terms.", "question": "What?"}
    assert_openai_error(client.post("/v1/documents/ask", json=body, headers=AUTH), 503, "chunker_unavailable")


# --- what fails inside stays inside ----------------------------------------------------------

SECRET = "Traceback (most recent call last): /srv/k25/engine/engine.py ValueError at 10.0.3.7:5557"


@pytest.mark.parametrize("code, status", [(k25_pb2.INTERNAL, 500), (k25_pb2.ADAPTER_NOT_FOUND, 404),
                                          (k25_pb2.CHUNK_SIZE_MISMATCH, 502), (99, 500)])
def test_engine_errors_with_internal_text_reach_the_client_as_a_request_id(caplog, code, status):
    with caplog.at_level(logging.ERROR, logger="services.gateway.errors"):
        error = from_engine_error(k25_pb2.Error(request_id="chatcmpl-1", code=code, message=SECRET))
    assert error.status == status and SECRET not in error.message and "request id req_" in error.message
    request_id = error.message.rsplit(" ", 1)[1]
    assert any(request_id in r.getMessage() and SECRET in r.getMessage() for r in caplog.records)


def test_engine_messages_written_for_the_client_pass():
    error = from_engine_error(k25_pb2.Error(code=k25_pb2.INVALID_ARGUMENT, message="top_p must be in (0, 1]"))
    assert (error.status, error.message) == (400, "top_p must be in (0, 1]")


def test_an_unexpected_exception_is_a_500_with_a_request_id_and_the_traceback_in_the_log(client, caplog):
    async def broken():
        raise KeyError(SECRET)

    client.app.add_api_route("/v1/test-broken", broken, methods=["POST"])
    with caplog.at_level(logging.ERROR, logger="services.gateway.errors"):
        response = TestClient(client.app, raise_server_exceptions=False).post("/v1/test-broken", headers=AUTH)
    error = assert_openai_error(response, 500, "internal_error")
    assert SECRET not in response.text and response.headers["x-request-id"] in error["message"]
    [record] = [r for r in caplog.records if response.headers["x-request-id"] in r.getMessage()]
    assert record.exc_info and SECRET in str(record.exc_info[1])


def template_refusal(template: str) -> OpenAIError:
    tokenizer = load_tokenizer("tiny-random")
    tokenizer.chat_template = template
    encoder = PromptEncoder(tokenizer, 1, Histogram("seconds", "test", registry=None))
    try:
        with pytest.raises(OpenAIError) as refused:
            asyncio.run(encoder.encode_chat([{"role": "user", "content": "hi"}]))
    finally:
        encoder.close()
    return refused.value


def test_a_chat_template_s_own_refusal_is_told_and_its_failures_are_not():
    refusal = template_refusal("{{ raise_exception('Conversation roles must alternate user/assistant') }}")
    assert refusal.status == 400 and refusal.message.endswith("Conversation roles must alternate user/assistant")
    failure = template_refusal("{{ messages[3].content.upper() }}")  # jinja's own error names the template's internals
    assert failure.status == 400 and "request id req_" in failure.message and "undefined" not in failure.message


@pytest.fixture(scope="module")
def unreachable_chunker(module_redis_url):  # noqa: F811
    settings = GatewaySettings(model="tiny-random", redis_url=module_redis_url, chunker_address=f"127.0.0.1:{free_port()}",
                               chunker_timeout_s=0.2)
    gateway = Gateway(settings, load_tokenizer("tiny-random"), redis.Redis.from_url(module_redis_url))
    with TestClient(create_app(gateway)) as test_client:
        yield test_client


def test_a_chunker_that_does_not_answer_is_504_without_its_address(unreachable_chunker, caplog):
    with caplog.at_level(logging.ERROR, logger="services.gateway.document_routes"):
        response = unreachable_chunker.post("/v1/chunks", json={"text": "Article 1. Terms."})
    error = assert_openai_error(response, 504, "deadline_exceeded")
    assert "127.0.0.1" not in error["message"] and response.headers["x-request-id"] in error["message"]
    assert any("127.0.0.1" in r.getMessage() and response.headers["x-request-id"] in r.getMessage() for r in caplog.records)
