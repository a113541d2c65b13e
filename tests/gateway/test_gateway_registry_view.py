"""The gateway's view of the registry against a real Redis: what it lists, and how long it
trusts engines seen before a Redis outage (each for its own heartbeat TTL)."""

import asyncio
from types import SimpleNamespace

import pytest
import redis

from common.redis_keys import register_engine
from services.gateway import registry_view
from services.gateway.registry_view import RegistryView
from tests.helpers.redis_server import redis_client, redis_server  # noqa: F401  (fixtures)


# entries live this long in Redis whatever they say, so that the test's own pace cannot expire them
REDIS_TTL_S = 60


def entry(pool: str, heartbeat_ttl_s: float) -> dict:
    return {"address": f"{pool}:1", "pool": pool, "model": "m", "chunk_size": 16, "max_model_len": 64,
            "free_kv_fraction": 1.0, "kv_admission_limit": 0.92, "max_waiting": 1024, "heartbeat_ttl_s": heartbeat_ttl_s}


@pytest.fixture
def clock(monkeypatch):
    now = SimpleNamespace(value=1000.0)
    monkeypatch.setattr(registry_view, "time", SimpleNamespace(time=lambda: now.value))
    return now


def refresh_at(view: RegistryView, clock, now: float) -> set[str]:
    clock.value = now
    asyncio.run(view.refresh())
    return {engine.engine_id for engine in view.engines}


def test_live_readable_entries_are_listed(redis_client, clock):
    register_engine(redis_client, "rel", "a", entry("a", 5.0), ttl_s=REDIS_TTL_S)
    register_engine(redis_client, "rel", "no-limits", {"address": "h:1", "pool": "p"}, ttl_s=REDIS_TTL_S)
    view = RegistryView(redis_client, "rel")
    assert refresh_at(view, clock, 1000.0) == {"a"} and view.redis_ok


def test_after_an_outage_engines_seen_before_stay_for_their_own_heartbeat_ttl(redis_client, clock):
    register_engine(redis_client, "rel", "quick", entry("quick", 2.0), ttl_s=REDIS_TTL_S)
    register_engine(redis_client, "rel", "slow", entry("slow", 10.0), ttl_s=REDIS_TTL_S)
    view = RegistryView(redis_client, "rel")
    assert refresh_at(view, clock, 1000.0) == {"quick", "slow"}

    view.client = redis.Redis(port=1, socket_connect_timeout=0.2)  # nothing listens there
    assert refresh_at(view, clock, 1001.0) == {"quick", "slow"} and view.redis_ok is False

    redis_client.flushall()  # Redis came back without its keys
    view.client = redis_client
    assert refresh_at(view, clock, 1002.0) == {"quick", "slow"} and view.redis_ok
    assert refresh_at(view, clock, 1004.5) == {"slow"}  # quick had 2 s to register again and did not
    register_engine(redis_client, "rel", "quick", entry("quick", 2.0), ttl_s=REDIS_TTL_S)
    assert refresh_at(view, clock, 1005.0) == {"quick", "slow"}
    assert refresh_at(view, clock, 1012.5) == {"quick"}
