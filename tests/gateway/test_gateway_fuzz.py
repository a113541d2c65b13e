"""Schemathesis generates requests for every route of the gateway's own OpenAPI document,
valid and invalid ones, and sends them to a real gateway in front of a real engine (the tiny
model) and a real chunker: none may be answered with a server error.

The cases are derandomized (a fixed seed, no example database), so a run either always finds
a failure or never does. Beside them, hand-made hostile values go into every field of every
route's body: lone surrogates, numbers beyond any integer or float type, deep nesting. 503
would be legitimate for an overloaded gateway or a missing engine (both documented), but these
servers are idle and complete, so here it is a failure too.
"""

import json

import httpx
import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, settings

from common.tokenizer import load_tokenizer
from services.gateway.app import create_app
from services.gateway.service import Gateway
from services.gateway.settings import GatewaySettings
from tests.helpers.chunker_process import start_chunker
from tests.helpers.engine_process import start_engine
from tests.helpers.gateway_process import http_json, start_gateway
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow  # starts real processes

# small answers keep each generated case quick: a max_tokens above the limit is a 400
MAX_TOKENS = 4

# the document the gateway serves at /openapi.json, built here so that the cases exist when
# pytest collects them (the served one is checked to be the same)
OPENAPI = create_app(Gateway(GatewaySettings(model="tiny-random"), load_tokenizer("tiny-random"), redis.Redis())).openapi()
schema = schemathesis.openapi.from_dict(OPENAPI)
schema.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE],
                                deterministic=True, database="none")


@pytest.fixture(scope="module")
def gateway(module_redis_url, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("fuzz")
    engine = start_engine(module_redis_url, str(folder / "engine.log"), "--model", "tiny-random", "--chunk-size", "64")
    chunker = start_chunker(folder / "chunker.log")
    service = start_gateway(module_redis_url, str(folder / "gateway.log"), "--chunker-address", f"127.0.0.1:{chunker.zmq_port}",
                            "--max-tokens-limit", str(MAX_TOKENS))
    assert http_json(f"{service.url}/openapi.json")[2] == OPENAPI
    yield service
    service.stop()
    chunker.process.terminate()
    chunker.process.wait(timeout=30)
    engine.stop()


@schema.parametrize()
@settings(max_examples=20, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_generated_request_gets_a_server_error(case, gateway):
    steer(case.body)
    response = case.call(base_url=gateway.url, timeout=600)  # the gateway's own request deadline
    assert response.status_code < 500, (
        f"{case.method} {case.path} -> {response.status_code} {response.text[:500]}\n{case.as_curl_command()}\n"
        f"gateway log:\n{gateway.log()[-3000:]}"
    )


def steer(body) -> None:
    """Point a generated body at what this gateway serves, so that cases get past the model
    lookup and the max_tokens limit to the engine: the served model's name, and short answers
    where the body leaves their length to the defaults (an invalid field stays as generated)."""
    if not isinstance(body, dict):
        return
    if isinstance(body.get("model"), str):
        body["model"] = "tiny-random"
    if "model" in body and "max_completion_tokens" not in body:
        body.setdefault("max_tokens", MAX_TOKENS)
    if "document" in body:
        body.setdefault("note_max_tokens", MAX_TOKENS)


# a valid body per route, into which each hostile value goes, one field at a time
BASES = {
    "/v1/chat/completions": {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS},
    "/v1/completions": {"model": "tiny-random", "prompt": "hi", "max_tokens": MAX_TOKENS},
    "/v1/chunks": {"text": "Article 1. Scope."},
    "/v1/documents": {"text": "Article 1. Scope.", "name": "scope.txt", "metadata": {"matter": "1"}},
    "/v1/documents/ask": {"model": "tiny-random", "document": "Article 1. Scope.", "question": "q", "max_tokens": MAX_TOKENS,
                          "note_max_tokens": MAX_TOKENS},
    "/v1/documents/extract": {"model": "tiny-random", "document": "Article 1. Scope. French law governs.",
                              "schema": {"type": "object", "properties": {"law": {"type": "string"}}},
                              "max_tokens": MAX_TOKENS, "note_max_tokens": MAX_TOKENS},
}
# JSON texts: a lone surrogate, numbers no int64 or float64 holds, a list nested deeper than a parser recurses
HOSTILE = ['"\\ud800"', '"a\\udfffb"', str(2**64), str(-(10**100)), "1e999", "[" * 100_000 + "]" * 100_000]
POSTS = [path for path, item in OPENAPI["paths"].items() if "post" in item]


def hostile_bodies(path: str):
    """The route's valid body with one field (each of its schema's, and one it does not know) set to each hostile value."""
    ref = OPENAPI["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    fields = [*OPENAPI["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"], "unknown_field"]
    for name in fields:
        for value in HOSTILE:
            base = json.dumps({k: v for k, v in BASES[path].items() if k != name})
            yield name, value, base[:-1] + f', "{name}": {value}}}'


def test_every_post_route_has_a_base_body():
    assert sorted(POSTS) == sorted(BASES)


@pytest.mark.parametrize("path", POSTS)
def test_hostile_values_in_any_field_get_no_server_error(path, gateway):
    failures = []
    for name, value, body in hostile_bodies(path):
        response = httpx.post(f"{gateway.url}{path}", content=body.encode(), headers={"Content-Type": "application/json"},
                              timeout=600)
        if response.status_code >= 500:
            failures.append(f"{name}={value[:20]}: {response.status_code} {response.text[:200]}")
    assert failures == [], "\n".join(failures) + f"\ngateway log:\n{gateway.log()[-3000:]}"
