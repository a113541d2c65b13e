"""Overload at five times an engine's capacity: the surplus gets 503 with Retry-After at once,
every request is answered, the gateway's memory stays bounded, and it serves afterwards."""

import concurrent.futures

import pytest

from tests.helpers.engine_process import start_engine
from tests.helpers.gateway_process import http_json, rss_bytes, start_gateway
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

# KV for 256 tokens (one chunk) and at most 4 queued: a few requests of 69 tokens run at once
ENGINE_FLAGS = ("--model", "tiny-random", "--chunk-size", "256", "--max-chunk-per-gpu", "1", "--max-waiting", "4")
CAPACITY = 3 + 4  # running (16 KV blocks / 5 per request, one kept free) + queued
BODY = {"model": "tiny-random", "prompt": "Write a poem", "max_tokens": 64, "temperature": 0}


@pytest.fixture(scope="module")
def gateway(module_redis_url, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("overload")
    engine = start_engine(module_redis_url, str(folder / "engine.log"), *ENGINE_FLAGS)
    service = start_gateway(module_redis_url, str(folder / "gateway.log"))
    yield service
    service.stop()
    engine.stop()


def burst(gateway, count: int) -> list[tuple[int, dict, dict]]:
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: http_json(f"{gateway.url}/v1/completions", BODY, timeout_s=120), range(count)))


def test_five_times_capacity(gateway):
    burst(gateway, 4)  # warm up: first connections, first compiled paths
    rss_before = rss_bytes(gateway.process.pid)
    for _ in range(3):
        results = burst(gateway, 5 * CAPACITY)
        statuses = [status for status, _, _ in results]
        assert set(statuses) == {200, 503}, statuses
        refused = [(headers, body) for status, headers, body in results if status == 503]
        assert all(headers.get("retry-after") == "1" for headers, _ in refused)
        assert all(body["error"]["code"] == "overloaded" for _, body in refused)
        served = [body for status, _, body in results if status == 200]
        assert all(body["usage"]["completion_tokens"] > 0 for body in served)
    assert rss_bytes(gateway.process.pid) - rss_before < 50 * 2**20
    assert http_json(f"{gateway.url}/v1/completions", BODY)[0] == 200
