"""The gateway's view of the registry against a real Redis: what it lists, and how long it
trusts engines seen before a Redis outage (each for its own heartbeat TTL)."""

import asyncio
import logging
from dataclasses import replace
from types import SimpleNamespace

import pytest
import redis

from common.redis_keys import register_engine
from common.rollout_keys import PROGRESSING, RolloutState, rollout_index_key, rollout_key, write_rollout
from services.gateway import registry_view
from services.gateway.registry_view import RegistryView
from services.gateway.routing import PoolInfo
from tests.helpers.redis_server import redis_client, redis_server  # noqa: F401  (fixtures)


CANARY = RolloutState(stable_version="v1", stable_source="a/v1", stable_sha256="a" * 64, canary_version="v2",
                      canary_source="a/v2", canary_sha256="b" * 64, canary_weight=20, phase=PROGRESSING)

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


def test_health_in_the_entries_is_read(redis_client, clock):
    """Engines that say they are unhealthy or draining stay in the view (they are still
    registered) but are not routable; an entry without those fields is an older, healthy engine."""
    register_engine(redis_client, "rel", "old", entry("p", 5.0), ttl_s=REDIS_TTL_S)
    register_engine(redis_client, "rel", "sick", {**entry("p", 5.0), "healthy": False, "step_failures": 4}, ttl_s=REDIS_TTL_S)
    register_engine(redis_client, "rel", "leaving", {**entry("p", 5.0), "draining": True}, ttl_s=REDIS_TTL_S)
    view = RegistryView(redis_client, "rel")
    assert refresh_at(view, clock, 1000.0) == {"old", "sick", "leaving"}
    assert {e.engine_id: e.routable for e in view.engines} == {"old": True, "sick": False, "leaving": False}


def test_pools_are_known_from_the_settings_and_from_every_engine_seen(redis_client, clock):
    view = RegistryView(redis_client, "rel", pools=(("short", 64), ("long", 256)))
    refresh_at(view, clock, 1000.0)
    assert view.pools == {"short": PoolInfo("short", 64), "long": PoolInfo("long", 256)}  # no engine yet
    register_engine(redis_client, "rel", "s1", {**entry("short", 5.0), "max_model_len": 512}, ttl_s=REDIS_TTL_S)
    register_engine(redis_client, "rel", "x1", entry("extra", 5.0), ttl_s=REDIS_TTL_S)
    refresh_at(view, clock, 1001.0)
    assert view.pools["short"] == PoolInfo("short", 16, 512)  # the engines say what the pool is
    assert view.pools["extra"] == PoolInfo("extra", 16, 64)
    redis_client.flushall()  # every engine gone: the pools are still known, scaled to zero
    refresh_at(view, clock, 1002.0)
    assert view.engines == [] and set(view.pools) == {"short", "long", "extra"}
    # a learned pool is forgotten once no engine of it was seen for its TTL; those the settings name stay
    refresh_at(view, clock, 1001.0 + registry_view.LEARNED_POOL_TTL_S + 1)
    assert view.pools == {"short": PoolInfo("short", 64), "long": PoolInfo("long", 256)}


def test_made_up_pools_cannot_grow_the_gateways_pools_without_bound(redis_client, clock, monkeypatch):
    monkeypatch.setattr(registry_view, "MAX_LEARNED_POOLS", 3)
    view = RegistryView(redis_client, "rel", pools=(("real", 64),))
    for second in range(6):  # a writer registers a new pool name every second
        register_engine(redis_client, "rel", f"fake{second}", entry(f"fake{second}", 5.0), ttl_s=1)
        refresh_at(view, clock, 1000.0 + second)
    assert len(view.pools) <= 1 + 3 and "real" in view.pools


@pytest.mark.parametrize("last_seen, now, ttl, limit, kept", [
    ({"a": 0.0, "b": 50.0}, 100.0, 60.0, 10, {"b"}),  # a was last seen 100 s ago
    ({"a": 40.0, "b": 50.0}, 100.0, 60.0, 10, {"a", "b"}),  # exactly its TTL ago counts as seen
    ({"a": 90.0, "b": 99.0, "c": 95.0}, 100.0, 60.0, 2, {"b", "c"}),  # the most recently seen
    ({}, 100.0, 60.0, 2, set()),
])
def test_learned_pools_kept(last_seen, now, ttl, limit, kept):
    assert set(registry_view.learned_pools_kept(last_seen, now, ttl, limit)) == kept


def test_an_entry_with_absurd_values_is_ignored_and_logged_once(redis_client, clock, caplog):
    """A fake engine claiming chunk_size 2**31 would make every gateway pad long prompts to 2**31 tokens."""
    register_engine(redis_client, "rel", "honest", entry("p", 5.0), ttl_s=REDIS_TTL_S)
    register_engine(redis_client, "rel", "fake", {**entry("p", 5.0), "chunk_size": 2**31}, ttl_s=REDIS_TTL_S)
    view = RegistryView(redis_client, "rel")
    with caplog.at_level(logging.WARNING, logger=registry_view.__name__):
        assert refresh_at(view, clock, 1000.0) == {"honest"}
        assert refresh_at(view, clock, 1001.0) == {"honest"}
    [logged] = [r.getMessage() for r in caplog.records]
    assert logged == "registry: ignoring engine fake: chunk_size 2147483648 is outside [1, 2097152]"
    assert view.pools["p"].chunk_size == 16


def test_a_malformed_rollout_index_member_costs_only_its_own_adapter(redis_client, clock, caplog):
    """It used to freeze every adapter's canary weight on every gateway."""
    write_rollout(redis_client, "rel", "legal", CANARY)
    write_rollout(redis_client, "rel", "tax", CANARY)
    view = RegistryView(redis_client, "rel")
    refresh_at(view, clock, 1000.0)
    assert set(view.rollouts) == {"legal", "tax"}
    redis_client.hset(rollout_key("rel", "tax"), "canary_weight", "lots")  # tax's hash breaks
    redis_client.sadd(rollout_index_key("rel"), "no such:name!", "ghost")  # a bad name; one without a hash
    write_rollout(redis_client, "rel", "legal", replace(CANARY, canary_weight=50))
    with caplog.at_level(logging.WARNING, logger=registry_view.__name__):
        refresh_at(view, clock, 1001.0)
    assert view.rollouts["legal"].canary_weight == 50  # the others move on
    assert view.rollouts["tax"].canary_weight == 20  # its last good state
    assert set(view.rollouts) == {"legal", "tax"}
    logged = sorted(r.getMessage() for r in caplog.records)
    assert len(logged) == 2 and "rollout no such:name!" in logged[0] and "rollout tax" in logged[1]


def test_registry_values_that_are_not_text_cost_only_their_own_entries(redis_client, clock, caplog):
    """An index member, a rollout field or an engine id that is not UTF-8 used to raise out of
    every refresh: the gateway's engines and canary weights froze."""
    write_rollout(redis_client, "rel", "legal", CANARY)
    write_rollout(redis_client, "rel", "tax", CANARY)
    register_engine(redis_client, "rel", "a", entry("a", 5.0), ttl_s=REDIS_TTL_S)
    view = RegistryView(redis_client, "rel")
    refresh_at(view, clock, 1000.0)
    redis_client.sadd(rollout_index_key("rel"), b"\xff\xfe")
    redis_client.hset(rollout_key("rel", "tax"), "allow_list", b"[\"\xff\"]")
    register_engine(redis_client, "rel", b"\xfe", entry("a", 5.0), ttl_s=REDIS_TTL_S)  # an id that is not UTF-8
    register_engine(redis_client, "rel", "b", entry("a", 5.0), ttl_s=REDIS_TTL_S)
    write_rollout(redis_client, "rel", "legal", replace(CANARY, canary_weight=50))
    with caplog.at_level(logging.WARNING, logger=registry_view.__name__):
        assert refresh_at(view, clock, 1001.0) == {"a", "b"}
    assert view.rollouts["legal"].canary_weight == 50 and view.rollouts["tax"].canary_weight == 20
    logged = sorted(r.getMessage() for r in caplog.records)
    assert len(logged) == 2 and "not UTF-8" in logged[0] and "rollout tax" in logged[1]


def test_waiting_for_a_refresh_ends_with_the_next_one(redis_client):
    view = RegistryView(redis_client, "rel")

    async def scenario():
        waiter = asyncio.create_task(view.wait_for_refresh(60))
        await asyncio.sleep(0)  # the waiter is waiting
        assert not waiter.done()
        await view.refresh()
        await asyncio.wait_for(waiter, 10)
        await view.wait_for_refresh(0.01)  # and one without a refresh ends at its timeout

    asyncio.run(scenario())
