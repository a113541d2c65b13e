"""What the operator reads for the predictive policy: pods' start-up times and placement
(plain dicts as the API returns them), the QPS series and the engines' queues (a real Redis)."""

import datetime

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from common.redis_keys import qps_bucket_key, register_engine
from operators.config import OperatorConfig
from operators.handlers import _read_signals
from operators.pool_signals import engine_signals, pod_signals, qps_series, startup_seconds
from operators.pool_spec import parse_pool_spec
from tests.helpers.redis_server import redis_server  # noqa: F401  (fixture)

SPEC = parse_pool_spec({"nodeType": "H100-80G", "model": "m", "chunkSize": 512})


def pod(created="2026-01-01T00:00:00Z", ready_at=None, unschedulable=False):
    conditions = []
    if ready_at:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": ready_at})
    if unschedulable:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no GPU"})
    return {"metadata": {"name": "p", "creationTimestamp": created}, "status": {"conditions": conditions}}


def test_a_ready_pods_start_up_is_creation_to_ready():
    assert startup_seconds(pod(ready_at="2026-01-01T00:02:30Z")) == 150.0
    assert startup_seconds(pod(ready_at="2026-01-01T00:02:30+00:00")) == 150.0


def test_pods_not_ready_or_without_timestamps_give_no_start_up():
    assert startup_seconds(pod()) is None
    assert startup_seconds({"status": {"conditions": [{"type": "Ready", "status": "True",
                                                       "lastTransitionTime": "2026-01-01T00:02:30Z"}]}}) is None
    not_ready = pod(ready_at="2026-01-01T00:02:30Z")
    not_ready["status"]["conditions"][0]["status"] = "False"
    assert startup_seconds(not_ready) is None


def test_pod_signals_collect_start_ups_and_count_pods_waiting_for_a_node():
    pods = [pod(ready_at="2026-01-01T00:01:00Z"), pod(ready_at="2026-01-01T00:03:00Z"), pod(unschedulable=True)]
    signals = pod_signals(pods)
    assert sorted(signals.startup_s) == [60.0, 180.0]
    assert signals.unschedulable == 1
    assert signals.starting_age_s == ()  # no time given: no ages


def test_pod_signals_give_the_ages_of_pods_not_ready_yet_leaving_out_those_being_deleted():
    now = datetime.datetime(2026, 1, 1, 0, 5, tzinfo=datetime.UTC).timestamp()
    deleting = pod(created="2026-01-01T00:04:00Z")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:04:30Z"
    pods = [pod(ready_at="2026-01-01T00:01:00Z"), pod(created="2026-01-01T00:03:00Z"), pod(unschedulable=True),
            deleting, {"metadata": {}, "status": {}}]
    assert sorted(pod_signals(pods, now).starting_age_s) == [120.0, 300.0]


def test_the_qps_series_is_the_buckets_of_the_last_complete_seconds_oldest_first(redis_server):
    client = redis.Redis.from_url(redis_server)
    client.set(qps_bucket_key("r", "h100", 997), 7)
    client.set(qps_bucket_key("r", "h100", 999), 9)
    client.set(qps_bucket_key("r", "h100", 1000), 100)  # the current second: still being written
    assert qps_series(client, "r", "h100", 1000.4, window_s=4) == (None, 7.0, None, 9.0)


def test_waiting_requests_add_up_and_the_worst_ttft_counts_over_the_pools_live_engines(redis_server):
    client = redis.Redis.from_url(redis_server)
    assert engine_signals(client, "r", "h100") == (None, None)
    register_engine(client, "r", "e1", {"pool": "h100", "waiting": 3, "ttft_p95_s": 0.4}, ttl_s=60)
    register_engine(client, "r", "e2", {"pool": "h100", "waiting": 4, "ttft_p95_s": 2.5}, ttl_s=60)
    register_engine(client, "r", "e3", {"pool": "a100", "waiting": 50, "ttft_p95_s": 9.0}, ttl_s=60)
    register_engine(client, "r", "e4", {"pool": "h100", "ttft_p95_s": None}, ttl_s=60)  # no first token lately
    register_engine(client, "r", "e5", {"pool": "h100", "waiting": True, "ttft_p95_s": "slow"}, ttl_s=60)  # garbage
    # absurd values, as the gateway's bounds see them (ENTRY_LIMITS): they cannot size the pool
    register_engine(client, "r", "e6", {"pool": "h100", "waiting": 1 << 40, "ttft_p95_s": 1e12}, ttl_s=60)
    register_engine(client, "r", "e7", {"pool": "h100", "waiting": -5, "ttft_p95_s": float("nan")}, ttl_s=60)
    assert engine_signals(client, "r", "h100") == (7, 2.5)


def test_without_redis_the_signals_are_the_pods_alone():
    client = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))  # nothing listens on port 1
    signals = _read_signals(client, OperatorConfig(), "h100", [pod(ready_at="2026-01-01T00:01:00Z")], 1000.0, SPEC)
    assert (signals.startup_s, signals.qps_series, signals.waiting) == ((60.0,), (), None)
