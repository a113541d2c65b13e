"""Request counts reach a real Redis in the operator's format, and survive a Redis outage."""

import pytest
import redis

from common.redis_keys import pool_qps
from common.adapter_stats import version_stats
from services.gateway.accounting import RequestAccounting, write_counts
from tests.helpers.redis_server import redis_server  # noqa: F401  (fixture)


def test_counts_are_what_the_operator_reads(redis_server):  # noqa: F811
    client = redis.Redis.from_url(redis_server)
    accounting = RequestAccounting("rel")
    for second in range(1000, 1010):
        for _ in range(second - 995):  # 5, 6, ..., 14 requests in successive seconds
            accounting.arrived("short", second + 0.5)
    write_counts(client, "rel", accounting.take(1010.0))
    reading = pool_qps(client, "rel", "short", now=1010.0, window_s=10)
    assert reading.qps == pytest.approx(sum(range(5, 15)) / 10)


def test_only_buckets_someone_reads_are_written(redis_server):  # noqa: F811
    """Per pool the request counts (the operator's QPS), per adapter version the outcomes
    (the canary analysis); a request to the base model leaves no outcome behind."""
    client = redis.Redis.from_url(redis_server)
    accounting = RequestAccounting("rel")
    accounting.arrived("short", 1009.0)
    accounting.arrived("short", 1009.1)
    accounting.finished("legal", "v2", 1009.2, latency_s=0.25, failed=False, tenant="acme")
    write_counts(client, "rel", accounting.take(1010.0))
    assert sorted(key.decode() for key in client.keys("*")) == [
        "rel:adapter_stats:legal@v2:1009", "rel:qps:short:1009", "rel:qps:short:1010"]


def test_a_quiet_pool_reads_zero_not_missing(redis_server):  # noqa: F811
    client = redis.Redis.from_url(redis_server)
    accounting = RequestAccounting("rel")
    accounting.arrived("long", 100.0)
    write_counts(client, "rel", accounting.take(100.5))
    for second in range(101, 105):
        write_counts(client, "rel", accounting.take(second + 0.1))
    assert pool_qps(client, "rel", "long", now=105.0, window_s=3).qps == 0.0


def test_counts_kept_while_redis_is_down_arrive_later(redis_server):  # noqa: F811
    accounting = RequestAccounting("rel")
    accounting.arrived("short", 500.0)
    accounting.arrived("short", 500.1)
    down = redis.Redis(port=1, socket_connect_timeout=0.2)  # nothing listens there
    taken = accounting.take(500.5)
    with pytest.raises(redis.ConnectionError):
        write_counts(down, "rel", taken)
    accounting.give_back(taken, 500.5)
    accounting.arrived("short", 500.9)
    client = redis.Redis.from_url(redis_server)
    write_counts(client, "rel", accounting.take(501.0))
    assert int(client.get("rel:qps:short:500")) == 3


def test_counts_older_than_redis_keeps_are_dropped_on_give_back():
    accounting = RequestAccounting("rel")
    accounting.arrived("short", 0.0)
    accounting.finished("legal", "v1", 0.2, 0.1, failed=False, tenant="acme")
    taken = accounting.take(0.5)
    accounting.give_back(taken, now=10_000.0)
    assert not accounting.pending.pools and not accounting.pending.versions


def test_adapter_version_outcomes_are_what_the_canary_analysis_reads(redis_server):  # noqa: F811
    client = redis.Redis.from_url(redis_server)
    accounting = RequestAccounting("rel")
    latencies = [0.03, 0.07, 0.2, 0.2, 0.4, 0.9, 2.0, 3.0, 7.0, 12.0]
    for i, latency in enumerate(latencies):
        accounting.arrived("short", 200.0)
        accounting.finished("legal", "v2", 200.0 + i / 20, latency, failed=i == 9, tenant="acme")
    accounting.finished("legal", "v1", 200.6, 0.1, failed=False, tenant="acme")
    write_counts(client, "rel", accounting.take(201.0))
    canary = version_stats(client, "rel", "legal", "v2", now=201.0, window_s=5)
    assert (canary.requests, canary.errors) == (10, 1)
    assert canary.p95_latency_s == float("inf")  # the 10th latency (12 s) is past the last finite bucket
    assert version_stats(client, "rel", "legal", "v1", now=201.0, window_s=5).requests == 1
