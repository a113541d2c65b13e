"""The gateway's HTTP edge in-process (no engine is needed for these paths): API keys,
request validation and body limits, all answered in OpenAI's error shape."""

import json

import pytest
from fastapi.testclient import TestClient

from common.tokenizer import load_tokenizer
from services.gateway.api_keys import ApiKeys, Caller, hash_key
from services.gateway.app import create_app
from services.gateway.service import Gateway
from services.gateway.settings import GatewaySettings
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

KEY = "k25-test-key"


@pytest.fixture(scope="module")
def client(module_redis_url):  # noqa: F811
    import redis

    settings = GatewaySettings(model="tiny-random", redis_url=module_redis_url, max_body_bytes=4096, max_tokens_limit=100)
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
    assert ready.status_code == 503 and ready.json()["engines"] == 0  # no engine has registered


def test_no_engine_is_503_with_retry_after(client):
    response = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert_openai_error(response, 503, "overloaded")
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
])
def test_bad_chat_requests_get_400_naming_the_field(client, body, param):
    assert_openai_error(client.post("/v1/chat/completions", json=body, headers=AUTH), 400, param=param)


@pytest.mark.parametrize("prompt", ["", [], [["a"]], ["a", "b"], [10**9]])
def test_bad_prompts_get_400(client, prompt):
    body = {"model": "tiny-random", "prompt": prompt}
    assert_openai_error(client.post("/v1/completions", json=body, headers=AUTH), 400)


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


def test_without_a_chunker_document_routes_are_503(client):
    response = client.post("/v1/chunks", json={"text": "Article 1. Terms."}, headers=AUTH)
    assert_openai_error(response, 503, "chunker_unavailable")
    body = {"model": "tiny-random", "document": "Article 1. Terms.", "question": "What?"}
    assert_openai_error(client.post("/v1/documents/ask", json=body, headers=AUTH), 503, "chunker_unavailable")
