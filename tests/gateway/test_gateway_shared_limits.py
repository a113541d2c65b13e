"""Tenant limits shared by gateway replicas through a real Redis: what one replica lets a tenant
spend or run counts at the others after an exchange, a replica that starts later starts from what
the tenant owes, a peer's garbage is ignored, and without Redis each replica limits on its own."""

import asyncio
from types import SimpleNamespace

import pytest
import redis

from common.tokenizer import load_tokenizer
from services.gateway.admission import Admission
from services.gateway.errors import OpenAIError
from services.gateway.metrics import GatewayMetrics
from services.gateway.service import Gateway
from services.gateway.settings import GatewaySettings
from services.gateway.shared_limits import exchange, tenant_key
from services.gateway.tenant_limits import TenantLimits
from tests.helpers.redis_server import redis_client, redis_server  # noqa: F401  (fixtures)

RELEASE = "shared"
RATE = TenantLimits(tokens_per_minute=1000)
TWO_AT_ONCE = TenantLimits(max_concurrent_requests=2)


@pytest.fixture
def clock():
    """One clock for both replicas (monotonic and wall time move together here)."""
    return SimpleNamespace(now=1_000_000.0)


def replica(clock) -> Admission:
    return Admission(100, GatewayMetrics(), clock=lambda: clock.now, wall_clock=lambda: clock.now)


def swap(client, *replicas: tuple[str, Admission]) -> None:
    """One exchange round: each replica publishes and reads, in turn."""
    for gateway_id, admission in replicas:
        admission.absorb(exchange(client, RELEASE, gateway_id, admission.snapshot()))


def refused(admission: Admission, tenant: str, limits: TenantLimits, tokens: int = 0) -> OpenAIError | None:
    """One request that reserves and spends `tokens`: the error it is refused with, or None."""
    try:
        ticket = admission.enter(tenant, limits)
    except OpenAIError as error:
        return error
    try:
        ticket.reserve(tokens)
        ticket.use(tokens)
    except OpenAIError as error:
        return error
    finally:
        ticket.close()
    return None


def test_what_one_replica_let_a_tenant_spend_counts_at_the_others(redis_client, clock):
    a, b = replica(clock), replica(clock)
    assert refused(a, "acme", RATE, 900) is None  # a request that spends 900
    swap(redis_client, ("a", a), ("b", b))
    # b had no bucket for acme: it starts from the lowest level a reported, not a full minute's worth
    assert refused(b, "acme", RATE, 200).status == 429
    assert refused(b, "acme", RATE, 50) is None  # 100 left between them; b spends 50

    clock.now += 0.5  # 8 tokens come back at 1000 a minute
    assert refused(a, "acme", RATE, 40) is None
    swap(redis_client, ("a", a), ("b", b))
    # a's 40 are charged at b too: 100 - 50 - 40 + 8 = 18 left
    assert refused(b, "acme", RATE, 30).status == 429
    assert refused(b, "acme", RATE, 15) is None
    # and b's 50 and 15 at a, which sees b for the first time now: 100 - 40 - 50 - 15 + 8 = 3 left
    swap(redis_client, ("b", b), ("a", a))
    assert refused(a, "acme", RATE, 10).status == 429
    assert refused(a, "acme", RATE, 3) is None


def test_requests_in_flight_at_one_replica_count_against_the_concurrency_limit_at_the_others(redis_client, clock):
    a, b = replica(clock), replica(clock)
    held = [a.enter("acme", TWO_AT_ONCE), a.enter("acme", TWO_AT_ONCE)]
    swap(redis_client, ("a", a), ("b", b))
    error = refused(b, "acme", TWO_AT_ONCE)
    assert error.status == 429 and "2 requests in flight" in error.message
    for ticket in held:
        ticket.close()
    swap(redis_client, ("a", a), ("b", b))
    assert refused(b, "acme", TWO_AT_ONCE) is None
    # a replica that stopped publishing stops counting once its word is stale
    held = [a.enter("acme", TWO_AT_ONCE), a.enter("acme", TWO_AT_ONCE)]
    swap(redis_client, ("a", a), ("b", b))
    clock.now += 60
    swap(redis_client, ("b", b))
    assert refused(b, "acme", TWO_AT_ONCE) is None


def test_a_peers_garbage_is_ignored(redis_client, clock):
    b = replica(clock)
    redis_client.sadd(f"{RELEASE}:limited_tenants", "acme")
    for peer, text in {"nan": "nan 0 - 1", "words": "lots of tokens", "huge": f"0 {1 << 40} - {clock.now}",
                       "inf": f"inf 1 5 {clock.now}"}.items():
        redis_client.hset(tenant_key(RELEASE, "acme"), peer, text)
    swap(redis_client, ("b", b))
    assert b.peers.in_flight == {"acme": 0} and refused(b, "acme", RATE, 1000) is None


def test_without_redis_a_gateway_limits_on_its_own_and_says_so_once(caplog):
    dead = redis.Redis(port=1, socket_connect_timeout=0.2)  # nothing listens there
    gateway = Gateway(GatewaySettings(model="tiny-random", release=RELEASE), load_tokenizer("tiny-random"), dead)
    for _ in range(2):
        asyncio.run(gateway._share_limits())
    assert gateway._limits_shared is False
    assert caplog.text.count("cannot share tenant limits through Redis") == 1
