"""A pool at zero engines, with real processes (Redis, `k25 gateway`, `k25 engine` on the
tiny model): the gateway is ready without engines, a request for the pool counts as its
demand in the QPS the operator reads, waits for an engine and is served once one registers,
or gets 503 with Retry-After when none comes within the gateway's bound."""

import concurrent.futures
import re
import time
import urllib.request

import pytest
import redis

from common.redis_keys import pool_qps
from tests.helpers.engine_process import RELEASE, start_engine, wait_until
from tests.helpers.gateway_process import http_json, start_gateway
from tests.helpers.redis_server import redis_server  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

BODY = {"model": "tiny-random", "prompt": "The weather today", "max_tokens": 4, "temperature": 0}


def gateway_metric(gateway, name: str) -> float:
    with urllib.request.urlopen(f"{gateway.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def demand_counted(db, pool: str) -> bool:
    reading = pool_qps(db, RELEASE, pool, time.time(), window_s=10)
    return bool(reading.qps)


def test_a_request_waits_for_an_engine_of_its_pool_and_is_served(redis_server, tmp_path):  # noqa: F811
    db = redis.Redis.from_url(redis_server)
    gateway = start_gateway(redis_server, str(tmp_path / "gateway.log"), "--pool", "default=64", "--engine-wait-s", "600")
    engine = None
    try:
        status, _, ready = http_json(f"{gateway.url}/readyz")
        assert status == 200 and ready["engines"] == 0 and ready["pools"] == {"default": {"chunk_size": 64, "engines": 0}}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(http_json, f"{gateway.url}/v1/completions", BODY, timeout_s=600)
            wait_until(lambda: gateway_metric(gateway, "k25_gateway_waiting_for_engine") == 1, timeout_s=60,
                       what="the request waiting for an engine")
            # its demand reaches the QPS the operator scales the pool on, before any engine exists
            wait_until(lambda: demand_counted(db, "default"), timeout_s=60, what="the pool's demand in Redis")
            assert not answer.done()
            engine = start_engine(redis_server, str(tmp_path / "engine.log"), "--model", "tiny-random", "--chunk-size", "64")
            status, _, body = answer.result(timeout=600)
        assert status == 200 and body["usage"]["completion_tokens"] >= 1, body
        assert gateway_metric(gateway, 'k25_gateway_engine_waits_total{outcome="served"}') == 1
        assert gateway_metric(gateway, "k25_gateway_waiting_for_engine") == 0
    finally:
        if engine is not None:
            engine.stop()
        gateway.stop()


def test_when_no_engine_comes_the_request_gets_503_with_retry_after(redis_server, tmp_path):  # noqa: F811
    db = redis.Redis.from_url(redis_server)
    gateway = start_gateway(redis_server, str(tmp_path / "gateway.log"), "--pool", "short=64", "--engine-wait-s", "2")
    try:
        started = time.monotonic()
        status, headers, body = http_json(f"{gateway.url}/v1/completions", BODY, timeout_s=120)
        assert time.monotonic() - started >= 2  # it waited its bound first
        assert status == 503 and headers["retry-after"] == "2", (status, headers)
        assert body["error"]["code"] == "no_engine_available" and "'short'" in body["error"]["message"]
        status, headers, body = http_json(f"{gateway.url}/v1/completions", {**BODY, "stream": True}, timeout_s=120)
        assert status == 503 and headers["retry-after"] == "2" and body["error"]["code"] == "no_engine_available"
        wait_until(lambda: demand_counted(db, "short"), timeout_s=60, what="the pool's demand in Redis")
        assert gateway_metric(gateway, 'k25_gateway_engine_waits_total{outcome="timed_out"}') == 2
    finally:
        gateway.stop()
