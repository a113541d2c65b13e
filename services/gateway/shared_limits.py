"""Tenant limits shared by every gateway replica, through Redis, so that N replicas do not give a
tenant N times its limits and a restarted replica does not forget what a tenant owes.

Each gateway keeps its own buckets and counts (admission.py decides locally, with no Redis call
on a request's path) and, once a second with the request counts, exchanges with the others:
- it publishes, per tenant it has seen, the tokens it has charged so far (a running total), the
  requests it has in flight and its bucket's level, each under its own id with the time;
- it reads the others' and charges into its own bucket what each other gateway charged since the
  last exchange, counts their requests in flight against the tenant's concurrency limit, and
  starts the bucket of a tenant it has not seen yet from the lowest level the others report.
Decisions are therefore at most one exchange late: a tenant may overshoot by what it can do in
about a second at each replica. When Redis cannot be reached each gateway keeps its own limits.

A value a peer publishes that is not a finite number (or a count out of range) is ignored."""

import math
from dataclasses import dataclass, field

TTL_S = 120  # a gateway that stopped publishing is forgotten after this
FRESH_S = 10.0  # a peer's in-flight count older than this is not counted
MAX_COUNT = 1 << 20


def tenants_key(release: str) -> str:
    return f"{release}:limited_tenants"


def tenant_key(release: str, tenant: str) -> str:
    """A hash: `<gateway id>` -> "spent in_flight level at" (tokens charged in total, requests in
    flight now, the bucket's level, the epoch second these were read)."""
    return f"{release}:tenant_state:{tenant}"


@dataclass(frozen=True)
class TenantState:
    spent: float  # tokens this gateway has charged the tenant since it started (refunds taken off)
    in_flight: int
    level: float | None  # its bucket's level, None when the tenant has no token rate here
    at: float  # epoch seconds


@dataclass
class PeerStates:
    """What the other gateways published, per tenant: gateway id -> its state."""

    by_tenant: dict[str, dict[str, TenantState]] = field(default_factory=dict)


def _encoded(state: TenantState) -> str:
    level = "-" if state.level is None else repr(state.level)
    return f"{state.spent!r} {state.in_flight} {level} {state.at!r}"


def _decoded(text) -> TenantState | None:
    try:
        spent, in_flight, level, at = (text.decode() if isinstance(text, bytes) else text).split()
        state = TenantState(float(spent), int(in_flight), None if level == "-" else float(level), float(at))
    except (ValueError, UnicodeDecodeError):
        return None
    numbers = [state.spent, state.at] + ([] if state.level is None else [state.level])
    if not all(math.isfinite(n) for n in numbers) or not 0 <= state.in_flight <= MAX_COUNT:
        return None
    return state


def exchange(client, release: str, gateway_id: str, mine: dict[str, TenantState]) -> PeerStates:
    """Publish this gateway's states and read everyone else's, for every tenant any gateway has
    seen (runs in a worker thread; raises what Redis raises)."""
    write = client.pipeline(transaction=False)
    if mine:
        write.sadd(tenants_key(release), *mine)
        write.expire(tenants_key(release), TTL_S)
    for tenant, state in mine.items():
        write.hset(tenant_key(release, tenant), gateway_id, _encoded(state))
        write.expire(tenant_key(release, tenant), TTL_S)
    write.smembers(tenants_key(release))
    tenants = sorted(t.decode() if isinstance(t, bytes) else t for t in write.execute()[-1])
    read = client.pipeline(transaction=False)
    for tenant in tenants:
        read.hgetall(tenant_key(release, tenant))
    peers = PeerStates()
    for tenant, published in zip(tenants, read.execute()):
        states = {}
        for member, text in published.items():
            member = member.decode() if isinstance(member, bytes) else member
            state = _decoded(text)
            if member != gateway_id and state is not None:
                states[member] = state
        peers.by_tenant[tenant] = states
    return peers
