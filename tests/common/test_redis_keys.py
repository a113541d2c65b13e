import pytest

from common.redis_keys import BUCKET_TTL_S, QpsReading, pool_qps, qps_bucket_key, record_requests
from tests.helpers.redis_server import redis_client, redis_server  # noqa: F401  (fixtures)

NOW = 1_700_000_000.25


def write(client, pool: str, second_counts: dict[int, int], release: str = "k25") -> None:
    pipe = client.pipeline()
    for second, count in second_counts.items():
        record_requests(pipe, release, pool, second + 0.5, count)
    pipe.execute()


def test_keys_are_prefixed_with_the_release_and_name_the_pool_and_second():
    assert qps_bucket_key("prod", "h100", 1234) == "prod:qps:h100:1234"


def test_recorded_requests_add_up_in_one_bucket_with_a_ttl(redis_client):
    write(redis_client, "h100", {1000: 3})
    record_requests(redis_client, "k25", "h100", 1000.9)  # a client works as well as a pipeline
    assert int(redis_client.get("k25:qps:h100:1000")) == 4
    assert 0 < redis_client.ttl("k25:qps:h100:1000") <= BUCKET_TTL_S


def test_negative_count_is_refused(redis_client):
    with pytest.raises(ValueError, match="negative"):
        record_requests(redis_client, "k25", "h100", NOW, -1)


def test_qps_is_the_mean_over_the_complete_seconds_of_the_window(redis_client):
    now_s = int(NOW)
    write(redis_client, "h100", {now_s - back: 100 for back in range(1, 11)})
    write(redis_client, "h100", {now_s - 11: 10_000})  # just outside the window
    write(redis_client, "h100", {now_s: 10_000})  # the current, incomplete second
    reading = pool_qps(redis_client, "k25", "h100", NOW, window_s=10)
    assert reading.qps == pytest.approx(100.0)
    assert reading.newest_bucket_age_s == pytest.approx(0.25)


def test_seconds_without_a_bucket_are_left_out_of_the_mean(redis_client):
    now_s = int(NOW)
    write(redis_client, "h100", {now_s - 1: 90, now_s - 2: 70})
    assert pool_qps(redis_client, "k25", "h100", NOW, window_s=10).qps == pytest.approx(80.0)


def test_an_idle_but_reporting_pool_reads_zero_not_missing(redis_client):
    now_s = int(NOW)
    write(redis_client, "h100", {now_s - back: 0 for back in range(1, 4)})
    assert pool_qps(redis_client, "k25", "h100", NOW) == QpsReading(qps=0.0, newest_bucket_age_s=pytest.approx(1.25))


def test_no_bucket_at_all_reads_as_missing(redis_client):
    assert pool_qps(redis_client, "k25", "h100", NOW) == QpsReading(qps=None, newest_bucket_age_s=None)


def test_old_buckets_only_read_as_stale_with_their_age(redis_client):
    now_s = int(NOW)
    write(redis_client, "h100", {now_s - 60: 500})
    reading = pool_qps(redis_client, "k25", "h100", NOW, window_s=10)
    assert reading.qps is None
    assert reading.newest_bucket_age_s == pytest.approx(60.25)


def test_pools_and_releases_do_not_see_each_other(redis_client):
    now_s = int(NOW)
    write(redis_client, "a100", {now_s - 1: 50})
    write(redis_client, "h100", {now_s - 1: 50}, release="other")
    assert pool_qps(redis_client, "k25", "h100", NOW).qps is None


def test_window_must_hold_at_least_one_second(redis_client):
    with pytest.raises(ValueError, match="window_s"):
        pool_qps(redis_client, "k25", "h100", NOW, window_s=0)
