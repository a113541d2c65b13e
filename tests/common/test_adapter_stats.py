"""The per-version outcome buckets against a real Redis: what the gateways write, the sums and
the p95 of a window (checked against numpy's percentile), and the weighing by tenant that keeps
one tenant from deciding a canary's verdict."""

import math
import time

import numpy as np
import pytest

from common.adapter_stats import (
    LATENCY_BUCKETS,
    Outcomes,
    adapter_stats_key,
    record_version_outcomes,
    version_stats,
    weighed_stats,
)
from tests.helpers.redis_server import redis_client, redis_server  # noqa: F401  (fixtures)


def record(client, second, requests, errors, latencies, version="v2"):
    pipe = client.pipeline()
    record_version_outcomes(pipe, "rel", "legal", version, second, requests, errors, latencies)
    pipe.execute()


def test_outcomes_land_in_the_documented_per_second_hash_with_non_cumulative_buckets(redis_client):
    record(redis_client, 1000, 4, 1, [0.05, 0.0500001, 0.3, 11.0])
    record(redis_client, 1000, 1, 0, [0.3])  # a second gateway adds to the same bucket
    key = "rel:adapter_stats:legal@v2:1000"
    assert adapter_stats_key("rel", "legal", "v2", 1000) == key
    raw = {k.decode(): float(v) for k, v in redis_client.hgetall(key).items()}
    assert raw == pytest.approx({"requests": 5, "errors": 1, "latency_s_sum": 11.7000001,
                                 "le_0.05": 1, "le_0.1": 1, "le_0.5": 2, "le_inf": 1})
    assert 295 <= redis_client.ttl(key) <= 300


def test_stats_sum_the_complete_seconds_of_the_window_only(redis_client):
    now = 2000.7
    record(redis_client, 2000, 50, 50, [0.01] * 50)  # the current second: still being written
    record(redis_client, 1999, 10, 1, [0.01] * 10)
    record(redis_client, 1997, 30, 2, [0.2] * 30)
    record(redis_client, 1995, 40, 40, [9.0] * 40)  # just outside a 4 s window
    record(redis_client, 1999, 99, 0, [0.01] * 99, version="v1")  # another version
    stats = version_stats(redis_client, "rel", "legal", "v2", now, window_s=4)
    assert (stats.requests, stats.errors) == (40, 3)
    assert stats.error_rate == pytest.approx(3 / 40)
    assert stats.p95_latency_s == 0.25  # the 38th of 40 latencies is 0.2 s, in (0.1, 0.25]
    assert version_stats(redis_client, "rel", "legal", "v2", now, window_s=5).errors == 43


def test_no_traffic_reads_as_zero_requests_without_rates(redis_client):
    stats = version_stats(redis_client, "rel", "legal", "v2", time.time(), window_s=10)
    assert (stats.requests, stats.errors, stats.error_rate, stats.p95_latency_s) == (0, 0, None, None)


def bucket_bound(latency: float) -> float:
    return min(bound for _, bound in LATENCY_BUCKETS if latency <= bound)


@pytest.mark.parametrize("samples", [
    np.random.default_rng(0).lognormal(mean=-1.5, sigma=1.0, size=1000),
    np.random.default_rng(1).exponential(scale=0.4, size=37),
    np.random.default_rng(2).uniform(0.0, 12.0, size=500),  # some above 10 s
    np.array([0.05] * 95 + [1.0] * 5),  # exactly on bounds; the 95th of 100 is the last 0.05
    np.array([0.05] * 94 + [1.0] * 6),
    np.array([3.0]),
], ids=["lognormal", "exponential-37", "uniform-to-12s", "on-bounds-95", "on-bounds-94", "one"])
def test_p95_is_the_bound_of_the_bucket_holding_numpys_95th_percentile(redis_client, samples):
    """numpy's inverted-CDF percentile is the nearest-rank p95 sample; ours must be the
    upper bound of its bucket, whichever seconds the samples were spread over."""
    expected = bucket_bound(float(np.percentile(samples, 95, method="inverted_cdf")))
    for i, chunk in enumerate(np.array_split(samples, 7)):
        record(redis_client, 3000 + i, len(chunk), 0, chunk.tolist())
    assert version_stats(redis_client, "rel", "legal", "v2", 3008.0, window_s=10).p95_latency_s == expected


@pytest.mark.parametrize("requests, errors, latencies, second, message", [
    (-1, 0, [], 1, "requests must be a non-negative integer"),
    (1, -1, [], 1, "errors must be a non-negative integer"),
    (1, 2, [], 1, r"errors \(2\) must not exceed requests \(1\)"),
    (1.5, 0, [], 1, "requests must be a non-negative integer"),
    (1, 0, [-0.1], 1, "latencies must be non-negative"),
    (1, 0, [math.nan], 1, "latencies must be non-negative"),
    (1, 0, [0.1], 1.5, "epoch_second must be an integer"),
])
def test_bad_outcomes_are_refused_before_anything_is_written(redis_client, requests, errors, latencies, second, message):
    with pytest.raises(ValueError, match=message):
        record(redis_client, second, requests, errors, latencies)
    assert redis_client.keys("*") == []


@pytest.mark.parametrize("window", [0, 301, 2.0])
def test_a_window_outside_the_buckets_life_is_refused(redis_client, window):
    with pytest.raises(ValueError, match="window_s must be an integer from 1 to 300"):
        version_stats(redis_client, "rel", "legal", "v2", 1000.0, window_s=window)


def test_a_tenant_s_outcomes_also_land_under_its_own_fields(redis_client):
    pipe = redis_client.pipeline()
    record_version_outcomes(pipe, "rel", "legal", "v2", 1000, 2, 1, [0.03, 0.3], tenant="acme")
    record_version_outcomes(pipe, "rel", "legal", "v2", 1000, 1, 0, [0.03], tenant="a|b")  # any tenant name
    pipe.execute()
    raw = {k.decode(): float(v) for k, v in redis_client.hgetall("rel:adapter_stats:legal@v2:1000").items()}
    assert raw == pytest.approx({"requests": 3, "errors": 1, "latency_s_sum": 0.36, "le_0.05": 2, "le_0.5": 1,
                                 "requests|acme": 2, "errors|acme": 1, "le_0.05|acme": 1, "le_0.5|acme": 1,
                                 "requests|a|b": 1, "errors|a|b": 0, "le_0.05|a|b": 1})


def outcomes(requests: int, errors: int, slow: int = 0) -> Outcomes:
    """`slow` of the requests took 5 s (le_5), the others 0.05 s (le_0.05)."""
    histogram = [0] * len(LATENCY_BUCKETS)
    histogram[0], histogram[6] = requests - slow, slow
    return Outcomes(requests, errors, histogram)


@pytest.mark.parametrize("tenants, cap, error_rate, p95", [
    ([outcomes(200, 2)], 10, 0.01, 0.05),  # one tenant: its own rate, however many it sent
    ([outcomes(4, 1, slow=1), outcomes(0, 0)], 10, 0.25, 5.0),  # a tenant without requests is no tenant
    ([outcomes(1000, 1000, slow=1000), outcomes(50, 0), outcomes(50, 0)], 10, 0.0, 0.05),  # one alone: left out
    ([outcomes(10, 1), outcomes(10, 2), outcomes(10, 0)], 10, 0.05, 0.05),  # without the worst: 1 of 20
    ([outcomes(1000, 0), outcomes(20, 20), outcomes(20, 20)], 10, 0.5, 0.05),  # successes hide no one's failures
    ([outcomes(1000, 0, slow=1000), outcomes(20, 0, slow=20), outcomes(20, 0)], 10, 0.0, 5.0),  # nor slowness
    ([outcomes(30, 3), outcomes(30, 3), outcomes(3, 0)], 10, 1 / 13, 0.05),  # each weighs its requests up to the cap
    ([Outcomes(5, 1), Outcomes(5, 0)], 10, 0.0, None),  # no latencies written: no p95
    ([], 10, None, None),
])
def test_each_tenant_weighs_as_much_as_its_requests_up_to_the_cap(tenants, cap, error_rate, p95):
    stats = weighed_stats(tenants, cap)
    assert stats.requests == sum(t.requests for t in tenants) and stats.errors == sum(t.errors for t in tenants)
    assert stats.error_rate == (pytest.approx(error_rate) if error_rate is not None else None)
    assert stats.p95_latency_s == p95


def test_the_cap_must_be_a_request_at_least():
    with pytest.raises(ValueError, match="max_requests_per_tenant must be at least 1"):
        weighed_stats([outcomes(1, 0)], 0)


def test_a_window_weighs_each_tenant_over_all_its_seconds_and_unattributed_requests_as_one_more(redis_client):
    """(Plain, the steering tenant's failures are 87% of the canary's requests.)"""
    pipe = redis_client.pipeline()
    for second in (1997, 1998, 1999):
        record_version_outcomes(pipe, "rel", "legal", "v2", second, 100, 100, [0.03] * 100, tenant="steering")
        record_version_outcomes(pipe, "rel", "legal", "v2", second, 5, 0, [0.03] * 5, tenant="acme")
    record_version_outcomes(pipe, "rel", "legal", "v2", 1999, 30, 0, [0.03] * 30)  # a gateway without tenants
    pipe.execute()
    plain = version_stats(redis_client, "rel", "legal", "v2", 2000.5, window_s=5)
    assert (plain.requests, plain.errors) == (345, 300) and plain.error_rate == pytest.approx(300 / 345)
    weighed = version_stats(redis_client, "rel", "legal", "v2", 2000.5, window_s=5, max_requests_per_tenant=10)
    assert (weighed.requests, weighed.errors) == (345, 300)
    assert weighed.error_rate == 0.0  # steering's 10 of 10 left out; acme's 0 of 10 and the unattributed 0 of 10
