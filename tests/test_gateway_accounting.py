"""Request counts reach a real Redis in the operator's format, and survive a Redis outage."""

import pytest
import redis

from k25.redis_keys import pool_qps, stats_key
from redis_server import redis_server  # noqa: F401  (fixture)
from services.gateway.accounting import RequestAccounting, write_counts


def test_counts_are_what_the_operator_reads(redis_server):  # noqa: F811
    client = redis.Redis.from_url(redis_server)
    accounting = RequestAccounting("rel")
    for second in range(1000, 1010):
        for _ in range(second - 995):  # 5, 6, ..., 14 requests in successive seconds
            accounting.arrived("short", second + 0.5)
    accounting.finished("short", 1009.2, latency_s=0.25, failed=False)
    accounting.finished("short", 1009.7, latency_s=0.75, failed=True)
    write_counts(client, "rel", accounting.take(1010.0))
    reading = pool_qps(client, "rel", "short", now=1010.0, window_s=10)
    assert reading.qps == pytest.approx(sum(range(5, 15)) / 10)
    stats = {k.decode(): float(v) for k, v in client.hgetall(stats_key("rel", "short", 1009)).items()}
    assert stats == {"completed": 2, "errors": 1, "latency_s_sum": 1.0}


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
    taken = accounting.take(0.5)
    accounting.give_back(taken, now=10_000.0)
    assert not accounting.pending
