"""engine.serve.heartbeat and engine.serve.registry against a real (private) Redis, without an engine."""

import json
import logging

import pytest

from common.redis_keys import engines_expiry_key, engines_key, live_engines, register_engine
from engine.serve.health import HealthReport
from engine.serve.heartbeat import Heartbeat, registry_client
from engine.serve.registry import EngineProfile, EngineStats, registry_entry
from tests.helpers.engine_process import wait_until
from tests.helpers.redis_server import free_port, redis_client, redis_server  # noqa: F401  (fixtures)

PROFILE = EngineProfile(
    engine_id="e1", address="10.0.0.7:5555", pool="long", node_type="h100-80g", model="smollm2-135m",
    chunk_size=4096, max_chunk_per_gpu=8, capacity_tokens=32768, max_model_len=8192,
    kv_admission_limit=0.9, max_waiting=256, heartbeat_ttl_s=5.0, block_size=32, incarnation="abc", dtype="bfloat16",
)


def test_the_entry_holds_the_facts_and_the_load():
    stats = EngineStats(running=3, waiting=1, kv_usage=0.25, preemptions=2, prefix_queried_tokens=400, prefix_hit_tokens=96)
    entry = registry_entry(PROFILE, stats)
    assert entry == {
        "engine_id": "e1", "address": "10.0.0.7:5555", "pool": "long", "node_type": "h100-80g",
        "model": "smollm2-135m", "chunk_size": 4096, "max_chunk_per_gpu": 8, "capacity_tokens": 32768,
        "max_model_len": 8192, "kv_admission_limit": 0.9, "max_waiting": 256, "heartbeat_ttl_s": 5.0,
        "free_kv_fraction": 0.75, "running": 3, "waiting": 1, "adapters": [],
        "block_size": 32, "prefix_caching": True, "incarnation": "abc", "dtype": "bfloat16", "prefix_cache_hit_rate": 0.24,
        "kv_tier_hit_share": {"device": 1.0}, "kv_tiers": [], "ttft_p95_s": None, "healthy": True, "unhealthy_reason": "", "draining": False, "last_step_at": None, "step_failures": 0,
    }
    assert json.loads(json.dumps(entry)) == entry


def test_the_entry_and_the_metrics_show_each_kv_tier():
    from engine.serve.metrics import EngineMetrics

    stats = EngineStats(
        prefix_queried_tokens=1000, prefix_hit_tokens=800, kv_tier_hit_tokens=(("host", 300), ("disk", 100)),
        kv_tier_blocks=(("host", 12, 4096), ("disk", 40, 16384)), kv_tier_copied_bytes=(("to_host", 8192),),
        kv_tier_copy_seconds=0.5, kv_tier_dropped_blocks=1,
    )
    entry = registry_entry(PROFILE, stats)
    assert entry["kv_tier_hit_share"] == {"device": 0.5, "host": 0.375, "disk": 0.125}
    assert entry["kv_tiers"] == ["host", "disk"]
    metrics = EngineMetrics()
    metrics.update_load(stats)
    metrics.update_load(stats)  # counters follow the engine's totals, not the number of updates
    value = metrics.registry.get_sample_value
    assert value("k25_engine_kv_tier_hits_total", {"tier": "device"}) == 400
    assert value("k25_engine_kv_tier_hits_total", {"tier": "disk"}) == 100
    assert value("k25_engine_kv_tier_blocks", {"tier": "disk"}) == 40
    assert value("k25_engine_kv_tier_bytes", {"tier": "host"}) == 4096
    assert value("k25_engine_kv_tier_copied_bytes_total", {"direction": "to_host"}) == 8192
    assert value("k25_engine_kv_tier_dropped_blocks_total") == 1


def test_the_entry_carries_the_health_judged_when_it_is_written():
    health = HealthReport(healthy=False, reason="its last 3 steps failed", last_step_at=1700000000.12345,
                          step_failures=4, draining=True)
    entry = registry_entry(PROFILE, EngineStats(), health)
    assert {k: entry[k] for k in ("healthy", "unhealthy_reason", "draining", "last_step_at", "step_failures")} == {
        "healthy": False, "unhealthy_reason": "its last 3 steps failed", "draining": True,
        "last_step_at": 1700000000.123, "step_failures": 4,
    }


def test_the_registry_is_one_structure_per_release():
    assert (engines_key("prod"), engines_expiry_key("prod")) == ("prod:engines", "prod:engines:expiry")


def redis_now_ms(client) -> int:
    seconds, microseconds = client.time()
    return seconds * 1000 + microseconds // 1000


def wait_until_redis_time_passes(client, epoch_ms: float) -> None:
    """Wait (bounded) until Redis' own clock, which judges expiry, is past `epoch_ms`."""
    wait_until(lambda: redis_now_ms(client) > epoch_ms, timeout_s=30, interval_s=0.02, what="Redis' clock passing the expiry")


def test_a_beat_writes_the_entry_with_a_ttl_and_stop_removes_it(redis_client):
    heartbeat = Heartbeat(redis_client, "k25", "e1", lambda: registry_entry(PROFILE, EngineStats()), interval_s=1, ttl_s=5)
    assert heartbeat.beat()
    assert 0 < redis_client.zscore("k25:engines:expiry", "e1") - redis_now_ms(redis_client) <= 5000
    assert live_engines(redis_client, "k25") == {"e1": registry_entry(PROFILE, EngineStats())}
    heartbeat.stop()
    assert live_engines(redis_client, "k25") == {}
    assert redis_client.exists("k25:engines", "k25:engines:expiry") == 0


def test_an_entry_not_refreshed_within_its_ttl_is_not_listed_and_is_removed(redis_client):
    register_engine(redis_client, "k25", "gone", {"address": "a:1"}, ttl_s=0.2)
    register_engine(redis_client, "k25", "alive", {"address": "b:2"}, ttl_s=5)
    assert set(live_engines(redis_client, "k25")) == {"alive", "gone"}
    wait_until_redis_time_passes(redis_client, redis_client.zscore("k25:engines:expiry", "gone"))
    assert live_engines(redis_client, "k25") == {"alive": {"address": "b:2"}}
    assert redis_client.hkeys("k25:engines") == [b"alive"]
    assert redis_client.zrange("k25:engines:expiry", 0, -1) == [b"alive"]


def test_a_refresh_pushes_the_expiry_one_ttl_ahead(redis_client):
    register_engine(redis_client, "k25", "e1", {"address": "a:1"}, ttl_s=0.2)
    first_expiry = redis_client.zscore("k25:engines:expiry", "e1")
    register_engine(redis_client, "k25", "e1", {"address": "a:1", "running": 1}, ttl_s=30)
    assert redis_client.zscore("k25:engines:expiry", "e1") - first_expiry >= 29_000
    wait_until_redis_time_passes(redis_client, first_expiry)  # past the first write's expiry, within the second's
    assert live_engines(redis_client, "k25") == {"e1": {"address": "a:1", "running": 1}}


def test_the_keys_expire_with_the_longest_lived_entry(redis_client):
    """A release whose engines all stopped beating leaves nothing in Redis, read or not."""
    register_engine(redis_client, "k25", "long", {"address": "a:1"}, ttl_s=5)
    register_engine(redis_client, "k25", "short", {"address": "b:2"}, ttl_s=1)
    assert 4000 < redis_client.pttl("k25:engines") <= 5000
    assert 4000 < redis_client.pttl("k25:engines:expiry") <= 5000


def test_live_engines_is_one_call(redis_client):
    register_engine(redis_client, "k25", "e1", {"address": "a:1"}, ttl_s=5)
    live_engines(redis_client, "k25")  # the first call also loads the script into Redis
    redis_client.config_resetstat()
    assert live_engines(redis_client, "k25") == {"e1": {"address": "a:1"}}
    calls = {name.removeprefix("cmdstat_"): stats["calls"] for name, stats in redis_client.info("commandstats").items()}
    assert calls["evalsha"] == 1 and "scan" not in calls and "keys" not in calls


def test_live_engines_skips_other_releases_and_unreadable_entries(redis_client):
    for release, engine_id in (("k25", "good"), ("k25", "broken"), ("k25", "a-list"), ("other", "x")):
        register_engine(redis_client, release, engine_id, {"address": "a:1"}, ttl_s=5)
    redis_client.hset("k25:engines", "broken", "{not json")
    redis_client.hset("k25:engines", "a-list", "[1, 2]")
    redis_client.hset("k25:engines", "no-expiry", json.dumps({"address": "c:3"}))  # never written by register_engine
    assert live_engines(redis_client, "k25") == {"good": {"address": "a:1"}}


def test_redis_down_is_logged_once_and_the_heartbeat_recovers(redis_server, caplog):
    dead = registry_client(f"redis://127.0.0.1:{free_port()}/0")
    heartbeat = Heartbeat(dead, "k25", "e1", lambda: {"address": "a:1"}, interval_s=1, ttl_s=5)
    with caplog.at_level(logging.WARNING, logger="engine.serve.heartbeat"):
        assert not heartbeat.beat()
        assert not heartbeat.beat()
    assert len([r for r in caplog.records if "unreachable" in r.message]) == 1

    heartbeat.client = registry_client(redis_server)  # Redis is back
    assert heartbeat.beat()
    assert not heartbeat.redis_down


def test_a_ttl_not_longer_than_the_interval_is_refused(redis_client):
    with pytest.raises(ValueError, match="longer than its interval"):
        Heartbeat(redis_client, "k25", "e1", dict, interval_s=5, ttl_s=5)
