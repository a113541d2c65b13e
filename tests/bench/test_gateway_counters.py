"""The prompt tokens each KV tier served, as a K25 gateway counts them from its engines' finals
and `k25 bench serve` reads them back from its /metrics: the real metrics registry, written out
by prometheus_client and parsed by its own parser."""

import time

import pytest
import redis
from opentelemetry import trace
from prometheus_client import generate_latest

from bench.gateway_counters import prompt_token_counters, tier_shares
from common.tokenizer import load_tokenizer
from proto import k25_pb2
from services.gateway.dispatch import Job
from services.gateway.outcome import RequestOutcome
from services.gateway.service import Gateway
from services.gateway.settings import GatewaySettings


def finished(gateway: Gateway, pool: str, **usage) -> None:
    job = Job(request_id=f"r-{time.monotonic_ns()}", tenant="t", model="tiny-random", prompt_token_ids=[5],
              sampling=k25_pb2.SamplingParams(max_tokens=1), deadline=time.time() + 60)
    outcome = RequestOutcome(gateway, pool, time.time(), job, False, trace.INVALID_SPAN)
    outcome.pool = pool
    outcome.finished(k25_pb2.Final(request_id=job.request_id, finish_reason=k25_pb2.STOP, usage=k25_pb2.Usage(**usage)))


def test_each_tier_counts_its_share_of_the_cached_prompt_over_every_pool():
    gateway = Gateway(GatewaySettings(model="tiny-random"), load_tokenizer("tiny-random"), redis.Redis(port=1))
    before = prompt_token_counters(generate_latest(gateway.metrics.registry).decode())
    assert before == {"prompt": 0, "device": 0, "host": 0, "disk": 0}
    finished(gateway, "a", prompt_tokens=100, cached_tokens=60, host_cached_tokens=20, disk_cached_tokens=10)
    finished(gateway, "b", prompt_tokens=100, cached_tokens=16)
    finished(gateway, "a", prompt_tokens=50)
    after = prompt_token_counters(generate_latest(gateway.metrics.registry).decode())
    assert after == {"prompt": 250, "device": 30 + 16, "host": 20, "disk": 10}
    assert tier_shares(before, after) == pytest.approx({"device": 46 / 250, "host": 20 / 250, "disk": 10 / 250})


def test_no_prompt_between_the_readings_is_no_share():
    nothing = {"prompt": 7, "device": 1, "host": 0, "disk": 0}
    assert tier_shares(nothing, nothing) is None


def test_metrics_of_another_server_count_nothing():
    assert prompt_token_counters("# HELP up 1\n# TYPE up gauge\nup 1\n") == {"prompt": 0, "device": 0, "host": 0, "disk": 0}
