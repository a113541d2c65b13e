"""Admission: the token bucket as plain functions, the gateway's and each tenant's limits as
counts, then through the HTTP API in-process: a refused request is answered before any of its
prompt is tokenised, and the API keys file is re-read when a Secret-style symlink swap changes it."""

import json
import math
import os

import pytest
import redis
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from common.tokenizer import load_tokenizer
from k25.cli import build_parser
from services.gateway.admission import Admission
from services.gateway.api_keys import ApiKeysFile, hash_key
from services.gateway.app import create_app
from services.gateway.errors import OpenAIError
from services.gateway.metrics import GatewayMetrics
from services.gateway.service import Gateway
from services.gateway.settings import GatewaySettings
from services.gateway.tenant_limits import (
    Bucket,
    TenantLimits,
    charged,
    full_bucket,
    refilled,
    retry_after_s,
    wait_s,
)
from tests.helpers.engine_process import wait_until
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

# --- the token bucket ----------------------------------------------------------------------


def test_a_full_bucket_holds_a_minute_of_tokens_and_refills_at_the_rate():
    bucket = full_bucket(600, now=0.0)
    assert wait_s(bucket, 600, 600) == 0.0
    empty = charged(bucket, 600, 600)
    assert wait_s(empty, 100, 600) == pytest.approx(10.0)  # 600 per minute: 10 per second
    assert refilled(empty, 600, now=5.0).level == pytest.approx(50.0)
    assert refilled(empty, 600, now=3600.0).level == 600.0  # never above a minute's worth


def test_more_than_a_minute_of_tokens_never_fits():
    assert math.isinf(wait_s(full_bucket(600, 0.0), 601, 600))


def test_a_debt_is_paid_back_before_anything_more_is_admitted():
    owing = charged(full_bucket(600, 0.0), 900, 600)  # a request used 300 more than the bucket held
    assert owing.level == -300.0
    assert wait_s(owing, 60, 600) == pytest.approx(36.0)  # 360 tokens to come back at 10 per second


def test_giving_back_never_overfills():
    assert charged(Bucket(590.0, 0.0), -50, 600).level == 600.0


@pytest.mark.parametrize("wait, header", [(0.01, 1), (1.0, 1), (1.2, 2), (36.0, 36)])
def test_retry_after_is_whole_seconds_never_shorter_than_the_wait(wait, header):
    assert retry_after_s(wait) == header


@given(st.integers(1, 10_000), st.lists(st.tuples(st.floats(0, 30), st.integers(1, 10_000)), max_size=60))
def test_admitted_tokens_never_exceed_a_minute_plus_the_refill(rate, requests):
    """Whatever arrives when, what is admitted up to time t is at most rate (the bucket) + rate/60 * t."""
    now, bucket, admitted = 0.0, full_bucket(rate, 0.0), 0
    for gap, tokens in requests:
        now += gap
        bucket = refilled(bucket, rate, now)
        if wait_s(bucket, tokens, rate) == 0:
            bucket = charged(bucket, tokens, rate)
            admitted += tokens
        assert admitted <= rate + rate / 60 * now + 1e-6 * rate


# --- the counts -------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refusal(call) -> OpenAIError:
    with pytest.raises(OpenAIError) as raised:
        call()
    return raised.value


def test_the_gateway_limit_is_503_and_a_tenant_s_is_429_with_retry_after():
    admission = Admission(max_inflight=3, metrics=GatewayMetrics())
    two = TenantLimits(max_concurrent_requests=2)
    tickets = [admission.enter("acme", two), admission.enter("acme", two)]
    error = refusal(lambda: admission.enter("acme", two))
    assert (error.status, error.type, error.code, error.headers) == (429, "requests", "rate_limit_exceeded", {"Retry-After": "1"})
    tickets.append(admission.enter("globex", None))
    error = refusal(lambda: admission.enter("globex", None))
    assert (error.status, error.code, error.headers["Retry-After"]) == (503, "overloaded", "1")
    tickets[0].close()
    tickets[0].close()  # closing twice frees one place
    assert admission.inflight == 2
    admission.enter("acme", two)
    assert refusal(lambda: admission.enter("acme", two)).status == 503  # the gateway is full again


def test_tokens_are_reserved_at_admission_and_settled_by_what_jobs_need():
    clock = Clock()
    admission = Admission(100, GatewayMetrics(), clock)
    limits = TenantLimits(tokens_per_minute=600)
    first = admission.enter("acme", limits)
    first.reserve(400)
    first.use(250)  # the prompt came out shorter than estimated
    second = admission.enter("acme", limits)
    error = refusal(lambda: second.reserve(300))  # 200 left: 100 short, at 10 per second
    assert (error.status, error.type, error.code, error.headers) == (429, "tokens", "rate_limit_exceeded", {"Retry-After": "10"})
    first.close()  # gives back the 150 reserved and never used
    second.reserve(300)
    second.use(500)  # needed 200 more than reserved: charged all the same, 150 owed
    assert refusal(lambda: second.reserve(1)).headers == {"Retry-After": "16"}  # 151 tokens at 10 per second
    clock.now += 15.2
    second.reserve(1)


def test_a_request_larger_than_a_minute_of_tokens_is_told_not_to_retry():
    admission = Admission(100, GatewayMetrics())
    ticket = admission.enter("acme", TenantLimits(tokens_per_minute=600))
    error = refusal(lambda: ticket.reserve(601))
    assert (error.status, error.type, error.code) == (429, "tokens", "rate_limit_exceeded")
    assert error.headers == {"x-should-retry": "false"} and "reduce the prompt or max_tokens" in error.message


def test_limits_apply_per_tenant():
    admission = Admission(100, GatewayMetrics())
    one = TenantLimits(max_concurrent_requests=1, tokens_per_minute=100)
    admission.enter("acme", one).reserve(100)
    admission.enter("globex", one).reserve(100)
    assert refusal(lambda: admission.enter("acme", one)).status == 429


# --- through the HTTP API --------------------------------------------------------------------

KEYS = {"acme": "k25-key-acme", "globex": "k25-key-globex", "initech": "k25-key-initech"}
CHAT = {"model": "tiny-random", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}


def keys_document(tenants: dict, revoked=()) -> dict:
    return {"keys": [{"sha256": hash_key(key), "tenant": tenant} for tenant, key in KEYS.items() if tenant not in revoked],
            "tenants": tenants}


def publish(folder, document: dict) -> str:
    """Write a new version of keys.json the way the kubelet updates a Secret volume: a new
    folder, then one atomic rename of the `..data` symlink; keys.json links through it."""
    version = len([p for p in os.listdir(folder) if p.startswith("..v")])
    data = folder / f"..v{version}"
    data.mkdir()
    (data / "keys.json").write_text(json.dumps(document))
    os.symlink(data.name, folder / "..data_tmp")
    os.replace(folder / "..data_tmp", folder / "..data")
    if not (folder / "keys.json").is_symlink():
        os.symlink("..data/keys.json", folder / "keys.json")
    return str(folder / "keys.json")


LIMITS = {"acme": {"tokens_per_minute": 600}, "globex": {"max_concurrent_requests": 1}}


@pytest.fixture(scope="module")
def served(module_redis_url, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("secret")
    path = publish(folder, keys_document(LIMITS))
    settings = GatewaySettings(model="tiny-random", redis_url=module_redis_url, engine_wait_s=0, max_inflight=4)
    gateway = Gateway(settings, load_tokenizer("tiny-random"), redis.Redis.from_url(module_redis_url))
    with TestClient(create_app(gateway, ApiKeysFile(path))) as client:
        yield client, gateway, folder


def as_tenant(tenant: str) -> dict:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


def tokenised(gateway: Gateway) -> float:
    return gateway.metrics.registry.get_sample_value("k25_gateway_tokenize_seconds_count") or 0.0


def test_over_the_token_rate_is_429_before_anything_is_tokenised(served):
    client, gateway, _ = served
    before = tokenised(gateway)
    response = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 601}, headers=as_tenant("acme"))
    assert response.status_code == 429 and response.json()["error"]["code"] == "rate_limit_exceeded"
    assert response.headers["x-should-retry"] == "false"
    response = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 590}, headers=as_tenant("acme"))
    assert response.status_code == 503  # admitted and tokenised: no engine is registered here
    assert tokenised(gateway) == before + 1
    response = client.post("/v1/completions", json={"model": "tiny-random", "prompt": "hello", "max_tokens": 100},
                           headers=as_tenant("acme"))
    assert response.status_code == 429
    assert response.json()["error"] == {"message": response.json()["error"]["message"], "type": "tokens", "param": None,
                                        "code": "rate_limit_exceeded"}
    assert 1 <= int(response.headers["retry-after"]) <= 60
    assert tokenised(gateway) == before + 1


def test_the_gateway_and_tenant_in_flight_limits_refuse_before_tokenising(served):
    client, gateway, _ = served
    before = tokenised(gateway)
    held = gateway.admission.enter("globex", TenantLimits(max_concurrent_requests=1))
    try:
        response = client.post("/v1/chat/completions", json=CHAT, headers=as_tenant("globex"))
        assert response.status_code == 429 and response.json()["error"]["type"] == "requests"
        assert response.headers["retry-after"] == "1"
        others = [gateway.admission.enter("initech", None) for _ in range(3)]  # the gateway's 4 places are taken
        response = client.post("/v1/chat/completions", json=CHAT, headers=as_tenant("initech"))
        assert response.status_code == 503 and response.json()["error"]["code"] == "overloaded"
        for ticket in others:
            ticket.close()
    finally:
        held.close()
    assert tokenised(gateway) == before
    assert client.post("/v1/chat/completions", json=CHAT, headers=as_tenant("globex")).status_code == 503  # no engine
    assert tokenised(gateway) == before + 1
    assert gateway.admission.inflight == 0


def test_every_response_carries_a_request_id(served):
    client, _, _ = served
    first = client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer wrong"})
    second = client.get("/healthz")
    assert first.status_code == 401
    assert first.headers["x-request-id"].startswith("req_") and first.headers["x-request-id"] != second.headers["x-request-id"]


def test_a_revoked_key_stops_working_and_new_limits_apply_without_a_restart(served):
    client, _, folder = served
    assert client.get("/v1/models", headers=as_tenant("initech")).status_code == 200
    publish(folder, keys_document({**LIMITS, "initech": {"tokens_per_minute": 10}}, revoked=["globex"]))
    wait_until(lambda: client.get("/v1/models", headers=as_tenant("globex")).status_code == 401, what="the revoked key refused")
    assert client.get("/v1/models", headers=as_tenant("initech")).status_code == 200
    response = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 20}, headers=as_tenant("initech"))
    assert response.status_code == 429 and response.json()["error"]["type"] == "tokens"
    publish(folder, keys_document(LIMITS))  # put back what the other tests expect
    wait_until(lambda: client.get("/v1/models", headers=as_tenant("globex")).status_code == 200, what="the key restored")


# --- the command line ---------------------------------------------------------------------------


def test_admission_flags_default_and_refuse_what_cannot_work(capsys, tmp_path):
    args = build_parser().parse_args(["gateway"])
    assert (args.max_inflight, args.tokenizer_threads, args.document_fanout) == (2048, 4, 8)
    for flag in ("--max-inflight", "--tokenizer-threads", "--document-fanout"):
        args = build_parser().parse_args(["gateway", flag, "0"])
        assert args.handler(args) == 2
        assert capsys.readouterr().err.strip() == f"k25 gateway: {flag} must be at least 1"
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({**keys_document({}), "tenants": {"acme": {"tokens_per_minute": -5}}}))
    args = build_parser().parse_args(["gateway", "--model", "tiny-random", "--api-keys-file", str(path)])
    assert args.handler(args) == 2
    assert "tenants.acme.tokens_per_minute must be a positive integer" in capsys.readouterr().err
