"""Clients steering a canary's verdict through the `user` values they choose, end to end: a
gateway places and books real requests (its registry read from a real Redis), flushes their
outcomes to Redis, and the operator's check reads them (`version_stats`, `decide_step`).

A hostile tenant tries users until it has some that land on the canary, then either sends
requests that fail there (to roll a good canary back) or floods it with requests that succeed
(to hide the failures other tenants see). Counted plainly, as before, either decides the
check; weighed by tenant, the check reads what the tenants see."""

import asyncio
import time

import pytest
import redis
from opentelemetry import trace

from common.adapter_stats import version_stats
from common.redis_keys import register_engine
from common.rollout_keys import PROGRESSING, RolloutState, write_rollout
from common.tokenizer import load_tokenizer
from operators.rollout_policy import ADVANCED, CHECK_FAILED, RolloutStatus, decide_step
from operators.rollout_spec import parse_rollout_spec
from operators.rollout_step import run_step
from proto import k25_pb2
from services.gateway.accounting import write_counts
from services.gateway.api_keys import Caller
from services.gateway.canary import CANARY
from services.gateway.dispatch import Job
from services.gateway.outcome import RequestOutcome
from services.gateway.service import Gateway
from services.gateway.settings import GatewaySettings
from tests.helpers.redis_server import redis_client, redis_server  # noqa: F401  (fixtures)

SHA = "a" * 64
RELEASE = "steer"
SPEC = parse_rollout_spec({
    "adapter": "legal", "pool": "default", "steps": [20, 50, 100], "interval": 60, "minRequestsPerStep": 50,
    "stable": {"version": "v1", "source": "legal/v1", "sha256": SHA},
    "canary": {"version": "v2", "source": "legal/v2", "sha256": SHA},
})
HONEST = [Caller(f"tenant-{i}", key_id=f"key-{i}") for i in range(5)]
MALLORY = Caller("mallory", key_id="key-mallory")


@pytest.fixture
def gateway(redis_client):  # noqa: F811
    write_rollout(redis_client, RELEASE, "legal", RolloutState("v1", "legal/v1", SHA, "v2", "legal/v2", SHA, 20,
                                                               phase=PROGRESSING))
    register_engine(redis_client, RELEASE, "e1", {
        "address": "127.0.0.1:1", "pool": "default", "model": "tiny-random", "chunk_size": 64, "max_model_len": 2048,
        "free_kv_fraction": 1.0, "kv_admission_limit": 0.92, "max_waiting": 1024, "heartbeat_ttl_s": 60.0,
        "adapters": ["legal@v1", "legal@v2"]}, ttl_s=60)
    gateway = Gateway(GatewaySettings(model="tiny-random", release=RELEASE), load_tokenizer("tiny-random"), redis_client)
    asyncio.run(gateway.registry.refresh())
    assert gateway.loaded_adapters() == {"legal@v1", "legal@v2"}, gateway.registry.ignored
    return gateway


def send(gateway: Gateway, caller: Caller, user: str, status_on: dict[str, int]) -> str:
    """Place one request as the gateway does and book its end with the status its version gets;
    returns the group it was placed in."""
    choice = gateway.resolve_model("legal", caller, user)
    job = Job(request_id=f"r-{caller.tenant}-{user}", tenant=caller.tenant, model="legal", prompt_token_ids=[5],
              sampling=k25_pb2.SamplingParams(max_tokens=1), deadline=time.time() + 60, adapter=choice)
    RequestOutcome(gateway, "default", time.time(), job, False, trace.INVALID_SPAN).done(status_on[choice.group])
    return choice.group


def canary_users(gateway: Gateway, caller: Caller, count: int) -> list[str]:
    """What a client finds by trying user ids (the answers tell the versions apart)."""
    found = (user for user in (f"probe-{i}" for i in range(100 * count))
             if gateway.resolve_model("legal", caller, user).group == CANARY)
    return [next(found) for _ in range(count)]


def verdicts(gateway: Gateway, client: redis.Redis) -> dict[str, str]:
    """The check's verdict on what was booked: read plainly (as the operator did before), and as
    the operator's step reads it now (weighed by tenant)."""
    write_counts(client, RELEASE, gateway.accounting.take(time.time()))
    now = time.time() + 2  # every second booked is complete
    status = RolloutStatus(stable="v1", canary="v2", phase=PROGRESSING, step=0, weight=20, failures=0,
                           window_start=now - 61, reason="Started", message="")
    canary, stable = (version_stats(client, RELEASE, "legal", version, now, 60) for version in ("v2", "v1"))
    return {"plain": decide_step(SPEC, status, canary, True, now, stable=stable).status.reason,
            "weighed": run_step(client, RELEASE, SPEC, status, now).result.status.reason}


def honest_traffic(gateway: Gateway, canary_status: int, tenants=HONEST) -> None:
    for caller in tenants:
        for user in range(100):
            send(gateway, caller, f"user-{user}", {"canary": canary_status, "stable": 200})


def test_a_tenant_that_fails_requests_on_users_it_placed_on_the_canary_cannot_roll_it_back(gateway, redis_client):  # noqa: F811
    honest_traffic(gateway, canary_status=200)
    for user in canary_users(gateway, MALLORY, 30):
        for _ in range(10):
            send(gateway, MALLORY, user, {"canary": 500, "stable": 200})  # e.g. requests that time out
    assert verdicts(gateway, redis_client) == {"plain": CHECK_FAILED, "weighed": ADVANCED}


def test_a_tenant_that_floods_the_canary_with_successes_cannot_hide_what_others_see(gateway, redis_client):  # noqa: F811
    honest_traffic(gateway, canary_status=500, tenants=HONEST[:2])  # the canary fails for two tenants
    honest_traffic(gateway, canary_status=200, tenants=HONEST[2:])
    for user in canary_users(gateway, MALLORY, 100):
        for _ in range(100):
            send(gateway, MALLORY, user, {"canary": 200, "stable": 200})
    assert verdicts(gateway, redis_client) == {"plain": ADVANCED, "weighed": CHECK_FAILED}


def test_a_canary_that_fails_every_tenant_fails_its_check_either_way(gateway, redis_client):  # noqa: F811
    honest_traffic(gateway, canary_status=500)
    assert verdicts(gateway, redis_client) == {"plain": CHECK_FAILED, "weighed": CHECK_FAILED}
