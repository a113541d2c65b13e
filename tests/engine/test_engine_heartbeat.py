"""engine.heartbeat and engine.registry against a real (private) Redis, without an engine."""

import json
import logging

import pytest

from common.redis_keys import engine_key, live_engines
from engine.heartbeat import Heartbeat, registry_client
from engine.registry import EngineProfile, EngineStats, registry_entry
from tests.helpers.redis_server import free_port, redis_client, redis_server  # noqa: F401  (fixtures)

PROFILE = EngineProfile(
    engine_id="e1", address="10.0.0.7:5555", pool="long", node_type="h100-80g", model="smollm2-135m",
    chunk_size=4096, max_chunk_per_gpu=8, capacity_tokens=32768, max_model_len=8192,
)


def test_the_entry_holds_the_facts_and_the_load():
    entry = registry_entry(PROFILE, EngineStats(running=3, waiting=1, kv_usage=0.25, preemptions=2))
    assert entry == {
        "engine_id": "e1", "address": "10.0.0.7:5555", "pool": "long", "node_type": "h100-80g",
        "model": "smollm2-135m", "chunk_size": 4096, "max_chunk_per_gpu": 8, "capacity_tokens": 32768,
        "max_model_len": 8192, "free_kv_fraction": 0.75, "running": 3, "waiting": 1, "adapters": [],
    }
    assert json.loads(json.dumps(entry)) == entry


def test_keys_are_prefixed_with_the_release():
    assert engine_key("prod", "pod-a-5555") == "prod:engine:pod-a-5555"


def test_a_beat_writes_the_entry_with_a_ttl_and_stop_removes_it(redis_client):
    heartbeat = Heartbeat(redis_client, "k25", "e1", lambda: registry_entry(PROFILE, EngineStats()), interval_s=1, ttl_s=5)
    assert heartbeat.beat()
    assert 0 < redis_client.pttl("k25:engine:e1") <= 5000
    assert live_engines(redis_client, "k25") == {"e1": registry_entry(PROFILE, EngineStats())}
    heartbeat.stop()
    assert redis_client.exists("k25:engine:e1") == 0
    assert live_engines(redis_client, "k25") == {}


def test_live_engines_skips_other_releases_and_unreadable_entries(redis_client):
    redis_client.set("k25:engine:good", json.dumps({"address": "a:1"}))
    redis_client.set("k25:engine:broken", "{not json")
    redis_client.set("other:engine:x", json.dumps({"address": "b:2"}))
    assert live_engines(redis_client, "k25") == {"good": {"address": "a:1"}}


def test_redis_down_is_logged_once_and_the_heartbeat_recovers(redis_server, caplog):
    dead = registry_client(f"redis://127.0.0.1:{free_port()}/0")
    heartbeat = Heartbeat(dead, "k25", "e1", lambda: {"address": "a:1"}, interval_s=1, ttl_s=5)
    with caplog.at_level(logging.WARNING, logger="engine.heartbeat"):
        assert not heartbeat.beat()
        assert not heartbeat.beat()
    assert len([r for r in caplog.records if "unreachable" in r.message]) == 1

    heartbeat.client = registry_client(redis_server)  # Redis is back
    assert heartbeat.beat()
    assert not heartbeat.redis_down


def test_a_ttl_not_longer_than_the_interval_is_refused(redis_client):
    with pytest.raises(ValueError, match="longer than its interval"):
        Heartbeat(redis_client, "k25", "e1", dict, interval_s=5, ttl_s=5)
