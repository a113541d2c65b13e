"""AdapterRollouts end to end: the operator against kmock's Kubernetes emulator and a real
Redis, fed with the gateway's outcome buckets (`record_version_outcomes`) and engine
registry entries (`register_engine`) written as those parts write them."""

import asyncio
import contextlib
import math
import time

import kmock
import pytest
import redis

from common.redis_keys import register_engine
from common.adapter_stats import record_version_outcomes
from common.rollout_keys import read_rollout, rollout_channel
from operators.config import OperatorConfig
from tests.helpers.operator_harness import NS, ROLLOUTS, cluster, create_resource, operator, running_operator, stored, wait_for  # noqa: F401
from tests.helpers.redis_server import redis_server  # noqa: F401  (fixture)

pytestmark = [pytest.mark.asyncio, pytest.mark.kmock(cls=kmock.KubernetesEmulator)]

SHA_V1, SHA_V2 = "1" * 64, "2" * 64
SPEC = {"adapter": "legal", "pool": "h100",
        "stable": {"version": "v1", "source": "legal/v1", "sha256": SHA_V1},
        "canary": {"version": "v2", "source": "legal/v2", "sha256": SHA_V2},
        "steps": [5, 20, 50, 100], "interval": 1, "maxErrorRate": 0.05, "maxP95LatencyMs": 1000,
        "minRequestsPerStep": 20, "failureThreshold": 2, "allowList": ["alice"]}


async def create_rollout(cluster, name: str, spec: dict, **where) -> None:
    await create_resource(cluster, "adapterrollouts", "AdapterRollout", name, spec, **where)


def status(cluster, name: str) -> dict:
    return (stored(cluster, ROLLOUTS, name) or {}).get("status", {})


def condition(cluster, name: str, kind: str) -> dict:
    return next((c for c in status(cluster, name).get("conditions", []) if c["type"] == kind), {})


def gateway_traffic(redis_url: str, version: str, requests: int, errors: int, latency_s: float) -> None:
    """What gateways record for one adapter version each second, from a minute ago to a
    minute ahead: a steady stream of requests with this many failing."""
    client = redis.Redis.from_url(redis_url)
    pipe = client.pipeline()
    now = math.floor(time.time())
    for second in range(now - 60, now + 60):
        record_version_outcomes(pipe, "test", "legal", version, second, requests, errors, [latency_s] * requests)
    pipe.execute()
    client.close()


def engines_report(redis_url: str, adapters_by_engine: dict[str, list[str]], pool: str = "h100") -> None:
    client = redis.Redis.from_url(redis_url)
    for engine_id, adapters in adapters_by_engine.items():
        register_engine(client, "test", engine_id, {"engine_id": engine_id, "pool": pool, "adapters": adapters},
                        ttl_s=120)
    client.close()


def rollout_state(redis_url: str):
    client = redis.Redis.from_url(redis_url)
    try:
        return read_rollout(client, "test", "legal")
    finally:
        client.close()


@contextlib.asynccontextmanager
async def announced_states(redis_url: str):
    """Every rollout state, read when its announcement arrives: (phase, weight, stable, canary)."""
    client = redis.Redis.from_url(redis_url)
    subscriber = client.pubsub()
    subscriber.subscribe(rollout_channel("test"))
    seen = []

    async def listen():
        while True:
            message = subscriber.get_message(timeout=0)
            if message and message["type"] == "message":
                state = read_rollout(client, "test", message["data"].decode())
                seen.append((state.phase, state.canary_weight, state.stable_version, state.canary_version))
            await asyncio.sleep(0.01)

    task = asyncio.create_task(listen())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        subscriber.close()
        client.close()


async def test_a_healthy_canary_walks_the_steps_once_every_engine_has_it_and_is_promoted(
        cluster, operator, redis_server):
    async with announced_states(redis_server) as announced:
        await create_rollout(cluster, "legal", SPEC)
        state = await wait_for(lambda: rollout_state(redis_server), "the rollout state appears in Redis")
        assert (state.phase, state.canary_weight, state.stable_version, state.canary_version) == (
            "Progressing", 5, "v1", "v2")
        assert (state.stable_source, state.stable_sha256, state.canary_source, state.canary_sha256) == (
            "legal/v1", SHA_V1, "legal/v2", SHA_V2)
        assert state.allow_list == ("alice",)

        gateway_traffic(redis_server, "v2", requests=30, errors=0, latency_s=0.2)
        engines_report(redis_server, {"e1": ["legal@v1", "legal@v2"], "e2": ["legal@v1"],
                                      "other": []})  # "other" serves another pool
        engines_report(redis_server, {"other": []}, pool="a100")
        await wait_for(lambda: status(cluster, "legal").get("reason") == "EnginesNotReady", "it holds for e2")
        assert status(cluster, "legal")["weight"] == 5 and rollout_state(redis_server).canary_weight == 5
        loaded = condition(cluster, "legal", "CanaryLoaded")
        assert (loaded["status"], loaded["reason"], loaded["message"]) == (
            "False", "EnginesNotReady", "legal@v2 not loaded on e2")

        weights = []

        def promoted():
            current = status(cluster, "legal")
            if not weights or weights[-1] != current.get("weight"):
                weights.append(current.get("weight"))
            return current.get("phase") == "Promoted"

        engines_report(redis_server, {"e2": ["legal@v2"]})
        await wait_for(promoted, "the canary is promoted")
        assert weights == [5, 20, 50, 100]
        await wait_for(lambda: len(announced) >= 5, "every change is announced")

    assert announced == [("Progressing", 5, "v1", "v2"), ("Progressing", 20, "v1", "v2"),
                         ("Progressing", 50, "v1", "v2"), ("Progressing", 100, "v1", "v2"),
                         ("Promoted", 0, "v2", "")]
    final = status(cluster, "legal")
    assert (final["failures"], final["message"]) == (0, "v2 promoted to stable, v1 unloaded")
    assert final["lastAnalysis"]["requests"] >= 20 and final["lastAnalysis"]["errorRate"] == 0
    assert final["lastAnalysis"]["p95LatencyMs"] == 250  # 0.2 s lies in the bucket up to 0.25 s
    assert condition(cluster, "legal", "Progressing")["status"] == "False"
    assert condition(cluster, "legal", "CanaryLoaded")["status"] == "True"
    state = rollout_state(redis_server)
    assert (state.stable_version, state.stable_source, state.stable_sha256) == ("v2", "legal/v2", SHA_V2)
    assert (state.canary_version, state.canary_weight, state.allow_list) == ("", 0, ())


async def test_a_failing_canary_is_rolled_back_and_its_traffic_returns_to_stable(cluster, operator, redis_server):
    engines_report(redis_server, {"e1": ["legal@v1", "legal@v2"]})
    gateway_traffic(redis_server, "v2", requests=30, errors=6, latency_s=0.2)  # 20% errors, 5% allowed
    await create_rollout(cluster, "legal", SPEC)
    failed = await wait_for(lambda: status(cluster, "legal").get("failures") == 1 and status(cluster, "legal"),
                            "the first check fails")
    assert (failed["phase"], failed["weight"], failed["reason"]) == ("Progressing", 5, "CheckFailed")

    rolled_back = await wait_for(lambda: status(cluster, "legal").get("phase") == "RolledBack"
                                 and status(cluster, "legal"), "the canary is rolled back")
    assert (rolled_back["weight"], rolled_back["failures"]) == (0, 2)
    assert rolled_back["message"] == "rolled back to v1 after 2 failed checks; last: error rate 20.00% > 5.00%"
    assert rolled_back["lastAnalysis"]["errorRate"] == pytest.approx(0.2)
    state = rollout_state(redis_server)
    assert (state.phase, state.canary_weight, state.canary_version, state.canary_source) == ("RolledBack", 0, "", "")
    assert (state.stable_version, state.stable_sha256) == ("v1", SHA_V1)

    generation = state.generation
    await asyncio.sleep(1.0)  # ticks go on: nothing changes, nothing is rewritten
    assert status(cluster, "legal")["phase"] == "RolledBack" and rollout_state(redis_server).generation == generation


async def test_deleting_the_rollout_removes_its_state_from_redis(cluster, operator, redis_server):
    await create_rollout(cluster, "legal", SPEC)
    await wait_for(lambda: rollout_state(redis_server), "the rollout state appears")
    response = await cluster.delete(f"/apis/k25.io/v1alpha1/namespaces/{NS}/adapterrollouts/legal")
    assert response.status == 200
    await wait_for(lambda: rollout_state(redis_server) is None, "the state goes")
    await wait_for(lambda: stored(cluster, ROLLOUTS, "legal") is None, "the rollout goes once the operator let it")


async def test_a_rollout_deleted_at_once_leaves_no_state_behind(cluster, operator, redis_server):
    # deleted before or after kopf puts its finalizer on: either way nothing may stay in Redis
    await create_rollout(cluster, "legal", SPEC)
    response = await cluster.delete(f"/apis/k25.io/v1alpha1/namespaces/{NS}/adapterrollouts/legal")
    assert response.status == 200
    await wait_for(lambda: stored(cluster, ROLLOUTS, "legal") is None, "the rollout goes")
    # written after the finalizer, state is removed before the rollout goes; written before it, it stays
    await wait_for(lambda: rollout_state(redis_server) is None, "no state left behind")


async def test_a_rollout_labelled_for_another_release_is_left_to_that_releases_operator(cluster, operator, redis_server):
    await create_rollout(cluster, "theirs", {**SPEC, "adapter": "contracts"}, release="other")
    await create_rollout(cluster, "legal", SPEC)
    await wait_for(lambda: rollout_state(redis_server), "its own release's rollout is stepped")
    theirs = stored(cluster, ROLLOUTS, "theirs")
    assert "status" not in theirs and not theirs["metadata"].get("finalizers")
    client = redis.Redis.from_url(redis_server)
    assert read_rollout(client, "test", "contracts") is None and read_rollout(client, "other", "contracts") is None
    client.close()


async def test_an_invalid_rollout_writes_nothing_and_says_why(cluster, operator, redis_server):
    await create_rollout(cluster, "legal", {**SPEC, "canary": {**SPEC["canary"], "version": "v1"}})
    invalid = await wait_for(lambda: status(cluster, "legal").get("phase") == "Invalid" and status(cluster, "legal"),
                             "the spec error is reported")
    assert invalid["message"] == "spec.canary.version must differ from spec.stable.version ('v1')"
    assert condition(cluster, "legal", "Progressing")["reason"] == "InvalidSpec"
    assert rollout_state(redis_server) is None


async def test_without_redis_the_rollout_holds_and_says_so(cluster):
    config = OperatorConfig(release="test", redis_url="redis://127.0.0.1:1/0", interval_s=0.2)  # nothing listens
    async with running_operator(cluster, config):
        await create_rollout(cluster, "legal", SPEC)
        progressing = await wait_for(lambda: condition(cluster, "legal", "Progressing").get("reason")
                                     == "RedisUnavailable" and condition(cluster, "legal", "Progressing"),
                                     "the outage is reported")
    assert progressing["status"] == "Unknown" and "cannot reach Redis" in progressing["message"]
    assert "weight" not in status(cluster, "legal")


async def test_a_second_rollout_of_the_same_adapter_waits_and_its_deletion_leaves_the_first_ones_state(
        cluster, operator, redis_server):
    await create_rollout(cluster, "legal", SPEC)
    await wait_for(lambda: rollout_state(redis_server), "the first rollout's state appears")
    other = {**SPEC, "canary": {"version": "v3", "source": "legal/v3", "sha256": "3" * 64}}
    await create_rollout(cluster, "legal-again", other)
    waiting = await wait_for(lambda: condition(cluster, "legal-again", "Progressing").get("reason") == "AdapterTaken"
                             and condition(cluster, "legal-again", "Progressing"), "the second one says it waits")
    assert f"AdapterRollout {NS}/legal" in waiting["message"] and status(cluster, "legal-again")["phase"] == "Conflict"
    # the second one has ticked (it says it waits) and wrote nothing: the state is still the first one's
    assert rollout_state(redis_server).canary_version == "v2"
    response = await cluster.delete(f"/apis/k25.io/v1alpha1/namespaces/{NS}/adapterrollouts/legal-again")
    assert response.status == 200
    await wait_for(lambda: stored(cluster, ROLLOUTS, "legal-again") is None, "the second one goes")
    assert rollout_state(redis_server).canary_version == "v2"
    # the first one deleted, its state goes with it
    response = await cluster.delete(f"/apis/k25.io/v1alpha1/namespaces/{NS}/adapterrollouts/legal")
    await wait_for(lambda: rollout_state(redis_server) is None, "the state goes with its owner")
