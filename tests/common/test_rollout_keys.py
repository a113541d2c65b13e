"""The rollout Redis contract against a real Redis: the state hash and its announcements,
the per-version outcome buckets, and the p95 checked against numpy's percentile."""

import json
import math
import time

import numpy as np
import pytest

from common.rollout_keys import (
    LATENCY_BUCKETS,
    PROGRESSING,
    RolloutState,
    RolloutStateError,
    adapter_stats_key,
    claim_rollout,
    read_all_rollouts,
    read_each_rollout,
    read_rollout,
    record_version_outcomes,
    release_rollout,
    rollout_channel,
    rollout_index_key,
    rollout_key,
    version_stats,
    versioned_name,
    write_rollout,
)
from tests.helpers.redis_server import redis_client, redis_server  # noqa: F401  (fixtures)

SHA_A, SHA_B = "a" * 64, "0123456789abcdef" * 4
CANARY = RolloutState(stable_version="v1", stable_source="legal/v1", stable_sha256=SHA_A, canary_version="v2",
                      canary_source="legal/v2", canary_sha256=SHA_B, canary_weight=20, allow_list=("alice", "bob"),
                      phase=PROGRESSING)
FIELDS = {"stable_version", "stable_source", "stable_sha256", "canary_version", "canary_source", "canary_sha256",
          "canary_weight", "allow_list", "phase", "generation"}


def test_a_written_state_reads_back_and_the_hash_holds_the_documented_fields(redis_client):
    assert write_rollout(redis_client, "rel", "legal", CANARY) == 1
    raw = {k.decode(): v.decode() for k, v in redis_client.hgetall("rel:rollout:legal").items()}
    assert set(raw) == FIELDS
    assert (raw["canary_weight"], json.loads(raw["allow_list"]), raw["phase"]) == ("20", ["alice", "bob"], "Progressing")
    assert read_rollout(redis_client, "rel", "legal") == RolloutState(**{**CANARY.__dict__, "generation": 1})


def test_every_write_increments_the_generation_whatever_the_state_says(redis_client):
    for expected in (1, 2, 3):
        assert write_rollout(redis_client, "rel", "legal", RolloutState(**{**CANARY.__dict__, "generation": 40})) == expected
    assert read_rollout(redis_client, "rel", "legal").generation == 3


def test_writes_and_deletes_are_announced_on_the_channel_with_the_adapter_name(redis_client):
    subscriber = redis_client.pubsub()
    subscriber.subscribe(rollout_channel("rel"))
    assert subscriber.get_message(timeout=1)["type"] == "subscribe"
    write_rollout(redis_client, "rel", "legal", CANARY)
    write_rollout(redis_client, "other", "legal", CANARY)  # another release's channel
    assert release_rollout(redis_client, "rel", "legal", "test/legal/uid") == 1
    messages = [subscriber.get_message(timeout=1) for _ in range(2)]
    assert [(m["channel"], m["data"]) for m in messages] == [(b"rel:rollouts", b"legal")] * 2
    assert subscriber.get_message(timeout=0.2) is None
    subscriber.close()


def test_a_state_is_visible_when_its_announcement_arrives(redis_client):
    """The write and the publish are one transaction: a subscriber that reads on the
    message never sees the previous state."""
    subscriber = redis_client.pubsub()
    subscriber.subscribe(rollout_channel("rel"))
    subscriber.get_message(timeout=1)
    for weight in (5, 20, 50):
        write_rollout(redis_client, "rel", "legal", RolloutState(**{**CANARY.__dict__, "canary_weight": weight}))
        assert subscriber.get_message(timeout=1)["data"] == b"legal"
        assert read_rollout(redis_client, "rel", "legal").canary_weight == weight
    subscriber.close()


def test_deleting_removes_the_state_and_says_whether_there_was_one(redis_client):
    write_rollout(redis_client, "rel", "legal", CANARY)
    assert release_rollout(redis_client, "rel", "legal", "test/legal/uid") == 1
    assert read_rollout(redis_client, "rel", "legal") is None
    assert read_all_rollouts(redis_client, "rel") == {}
    assert redis_client.smembers(rollout_index_key("rel")) == set()
    assert release_rollout(redis_client, "rel", "legal", "test/legal/uid") == 0


def test_one_rollout_owns_an_adapter_and_only_its_deletion_removes_the_state(redis_client):
    assert claim_rollout(redis_client, "rel", "legal", "ns/first/1") == "ns/first/1"
    assert claim_rollout(redis_client, "rel", "legal", "ns/second/2") == "ns/first/1"
    write_rollout(redis_client, "rel", "legal", CANARY)
    assert release_rollout(redis_client, "rel", "legal", "ns/second/2") == -1  # not its state
    assert read_rollout(redis_client, "rel", "legal") is not None
    assert release_rollout(redis_client, "rel", "legal", "ns/first/1") == 1
    assert read_rollout(redis_client, "rel", "legal") is None
    assert claim_rollout(redis_client, "rel", "legal", "ns/second/2") == "ns/second/2"  # free again


def test_read_all_returns_every_adapter_of_the_release_only(redis_client):
    plain = RolloutState(stable_version="v7", stable_source="summary/v7", stable_sha256=SHA_B)
    write_rollout(redis_client, "rel", "legal", CANARY)
    write_rollout(redis_client, "rel", "summary", plain)
    write_rollout(redis_client, "rel-2", "other", plain)
    redis_client.set("rel:rollouts-not-a-hash", "x")  # a neighbouring key outside the prefix
    states = read_all_rollouts(redis_client, "rel")
    assert {name: s.canary_weight for name, s in states.items()} == {"legal": 20, "summary": 0}
    assert states["summary"].has_canary is False and states["summary"].phase == "Stable"
    assert read_all_rollouts(redis_client, "none") == {}


def test_read_all_takes_the_index_not_a_scan(redis_client):
    """Gateways read every rollout twice a second: from the release's index, never by
    scanning a keyspace that grows with the per-second buckets."""
    write_rollout(redis_client, "rel", "legal", CANARY)
    assert rollout_index_key("rel") == "rel:rollout_adapters"
    assert redis_client.smembers("rel:rollout_adapters") == {b"legal"}
    redis_client.config_resetstat()
    assert set(read_all_rollouts(redis_client, "rel")) == {"legal"}
    calls = {name.removeprefix("cmdstat_"): stats["calls"] for name, stats in redis_client.info("commandstats").items()}
    assert (calls["smembers"], calls["hgetall"]) == (1, 1) and "scan" not in calls and "keys" not in calls


@pytest.mark.parametrize("change, message", [
    ({"canary_weight": 101}, "canary_weight must be an integer percent 0..100"),
    ({"canary_weight": -1}, "canary_weight must be an integer percent 0..100"),
    ({"canary_weight": 2.5}, "canary_weight must be an integer percent 0..100"),
    ({"canary_version": "", "canary_source": "", "canary_sha256": ""}, "canary_weight must be 0 without a canary"),
    ({"canary_source": ""}, "canary_source must be a non-empty path"),
    ({"canary_version": "v1"}, "canary_version must differ from stable_version"),
    ({"stable_sha256": "A" * 64}, "stable_sha256 must be 64 lowercase hex digits"),
    ({"canary_sha256": "abc"}, "canary_sha256 must be 64 lowercase hex digits"),
    ({"stable_version": "v1@x"}, "stable_version must be 1-63 letters"),
    ({"phase": "Paused"}, "phase must be one of"),
    ({"allow_list": ("alice", 7)}, "allow_list must hold user ids"),
    ({"generation": -1}, "generation must be a non-negative integer"),
])
def test_a_state_that_breaks_the_contract_is_refused(change, message):
    with pytest.raises(RolloutStateError, match=message):
        RolloutState(**{**CANARY.__dict__, **change})


@pytest.mark.parametrize("name", ["", "a:b", "a@b", "-lead", "x" * 64, "sp ace"])
def test_adapter_names_that_would_break_keys_are_refused(redis_client, name):
    with pytest.raises(RolloutStateError, match="adapter must be 1-63"):
        rollout_key("rel", name)
    with pytest.raises(RolloutStateError, match="adapter must be 1-63"):
        write_rollout(redis_client, "rel", name, CANARY)
    with pytest.raises(RolloutStateError, match="version must be 1-63"):
        versioned_name("legal", name)


@pytest.mark.parametrize("field, value, message", [
    ("canary_weight", "lots", "invalid literal"),
    ("allow_list", "[alice", "Expecting value"),
    ("allow_list", '{"alice": 1}', "allow_list must be a JSON list"),
    ("phase", "Paused", "phase must be one of"),
])
def test_a_hash_that_breaks_the_contract_is_reported_with_its_key(redis_client, field, value, message):
    write_rollout(redis_client, "rel", "legal", CANARY)
    redis_client.hset("rel:rollout:legal", field, value)
    with pytest.raises(RolloutStateError, match=f"rel:rollout:legal: .*{message}"):
        read_rollout(redis_client, "rel", "legal")
    with pytest.raises(RolloutStateError, match="rel:rollout:legal"):
        read_all_rollouts(redis_client, "rel")


def test_each_rollout_is_read_on_its_own_and_the_broken_ones_are_named(redis_client):
    write_rollout(redis_client, "rel", "legal", CANARY)
    write_rollout(redis_client, "rel", "tax", CANARY)
    redis_client.hset("rel:rollout:tax", "phase", "Paused")
    redis_client.sadd(rollout_index_key("rel"), "bad name")
    states, broken = read_each_rollout(redis_client, "rel")
    assert set(states) == {"legal"}
    assert set(broken) == {"bad name", "tax"}
    assert "rel:rollout:tax" in broken["tax"] and "phase must be one of" in broken["tax"]
    assert "rel:rollout_adapters" in broken["bad name"] and "'bad name'" in broken["bad name"]


def test_a_hash_with_missing_fields_names_them(redis_client):
    redis_client.hset("rel:rollout:legal", mapping={"stable_version": "v1"})
    with pytest.raises(RolloutStateError, match="missing field.*stable_source"):
        read_rollout(redis_client, "rel", "legal")


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
