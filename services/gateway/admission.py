"""Whether a request may start, decided before the gateway does any work for it.

`AdmissionMiddleware` runs before the request's body is read: every /v1/ path needs a valid
API key (when the gateway has a keys file), and every POST there takes a place within the
gateway's in-flight limit (503 past it) and its tenant's concurrency limit (429), held until
the response's last byte is sent. The route then reserves the request's tokens from its
tenant's token bucket (429 with Retry-After past it) before it tokenises anything; what the
request's engine jobs turn out to need is settled against that reservation as they are made.
The policy is tenant_limits.py; this file keeps the counts, and shares them with the other
gateway replicas through `snapshot` and `absorb` (shared_limits.py).
"""

import math
import time
from dataclasses import dataclass, field

from services.gateway.api_keys import ANONYMOUS, Caller
from services.gateway.errors import RETRY_AFTER_S, OpenAIError, overloaded, rate_limited, send_error
from services.gateway.metrics import GatewayMetrics
from services.gateway.shared_limits import FRESH_S, PeerStates, TenantState
from services.gateway.tenant_limits import Bucket, TenantLimits, charged, full_bucket, refilled, retry_after_s, wait_s


@dataclass
class Peers:
    """What the other gateways last said, per tenant."""

    in_flight: dict[str, int] = field(default_factory=dict)
    spent_absorbed: dict[str, dict[str, float]] = field(default_factory=dict)  # tenant -> gateway -> total
    levels: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # tenant -> [(level, epoch)]


class Admission:
    def __init__(self, max_inflight: int, metrics: GatewayMetrics, clock=time.monotonic, wall_clock=time.time):
        self.max_inflight = max_inflight
        self.metrics = metrics
        self.clock = clock
        self.wall_clock = wall_clock
        self.inflight = 0
        self._tenant_inflight: dict[str, int] = {}
        self._buckets: dict[str, Bucket] = {}
        self._rates: dict[str, int] = {}  # tenant -> its tokens per minute, as last seen
        self._spent: dict[str, float] = {}  # tenant -> tokens this gateway charged it (refunds taken off)
        self._limited: set[str] = set()  # the tenants with limits this gateway has seen: those it shares
        self.peers = Peers()

    def enter(self, tenant: str, limits: TenantLimits | None) -> "Ticket":
        """A place for one request, or 503 (the gateway is full) or 429 (the tenant is)."""
        if self.inflight >= self.max_inflight:
            self.metrics.rejected.labels("gateway_full").inc()
            raise overloaded(f"the gateway has {self.inflight} requests in flight (its limit); try again shortly")
        if limits is not None:
            self._limited.add(tenant)
        running = self._tenant_inflight.get(tenant, 0) + self.peers.in_flight.get(tenant, 0)
        limit = limits.max_concurrent_requests if limits else None
        if limit is not None and running >= limit:
            self.metrics.rejected.labels("tenant_concurrency").inc()
            raise rate_limited(f"tenant {tenant!r} has {running} requests in flight, its limit; try again when one ends",
                               "requests", RETRY_AFTER_S)
        self.inflight += 1
        self._tenant_inflight[tenant] = running + 1
        return Ticket(self, tenant, limits.tokens_per_minute if limits else None)

    def _leave(self, tenant: str) -> None:
        self.inflight -= 1
        self._tenant_inflight[tenant] -= 1
        if not self._tenant_inflight[tenant]:
            del self._tenant_inflight[tenant]

    def _bucket(self, tenant: str, tokens_per_minute: int) -> Bucket:
        now = self.clock()
        self._rates[tenant] = tokens_per_minute
        bucket = self._buckets.get(tenant) or self._first_bucket(tenant, tokens_per_minute, now)
        return refilled(bucket, tokens_per_minute, now)

    def _first_bucket(self, tenant: str, tokens_per_minute: int, now: float) -> Bucket:
        """Full, or as low as the lowest level another gateway reported (refilled since)."""
        wall = self.wall_clock()
        full = full_bucket(tokens_per_minute, now)
        reported = [level + max(0.0, wall - at) * tokens_per_minute / 60.0 for level, at in self.peers.levels.get(tenant, ())]
        return Bucket(min([full.level, *reported]), now)

    def _charge(self, tenant: str, tokens_per_minute: int, tokens: float, own: bool = True) -> None:
        self._buckets[tenant] = charged(self._bucket(tenant, tokens_per_minute), tokens, tokens_per_minute)
        if own:
            self._spent[tenant] = self._spent.get(tenant, 0.0) + tokens

    def snapshot(self) -> dict[str, TenantState]:
        """This gateway's state of every tenant it holds something of, for the other replicas."""
        wall = self.wall_clock()
        return {tenant: TenantState(
            spent=self._spent.get(tenant, 0.0), in_flight=self._tenant_inflight.get(tenant, 0),
            level=self._bucket(tenant, self._rates[tenant]).level if tenant in self._buckets else None, at=wall)
            for tenant in sorted(self._limited)}

    def absorb(self, peers: PeerStates) -> None:
        """Count the other gateways' requests in flight, charge what they charged since the last
        exchange, and keep their levels for tenants this gateway has no bucket for yet."""
        wall = self.wall_clock()
        in_flight, levels = {}, {}
        for tenant, states in peers.by_tenant.items():
            absorbed = self.peers.spent_absorbed.setdefault(tenant, {})
            rate = self._rates.get(tenant)
            for gateway, state in states.items():
                if rate is not None and tenant in self._buckets:
                    # a gateway first seen now charged what it says since it started, at most a
                    # minute's worth (a bucket made later starts from the levels, which hold it)
                    since = absorbed.get(gateway, state.spent - min(state.spent, rate))
                    if state.spent != since:
                        self._charge(tenant, rate, state.spent - since, own=False)
                absorbed[gateway] = state.spent
            for gone in set(absorbed) - set(states):
                del absorbed[gone]
            in_flight[tenant] = sum(s.in_flight for s in states.values() if wall - s.at <= FRESH_S)
            levels[tenant] = [(s.level, s.at) for s in states.values() if s.level is not None]
        self.peers.in_flight, self.peers.levels = in_flight, levels


class Ticket:
    """One admitted request's place and the tokens it has reserved but not yet used."""

    def __init__(self, admission: Admission, tenant: str, tokens_per_minute: int | None):
        self.admission, self.tenant, self.tokens_per_minute = admission, tenant, tokens_per_minute
        self.unused = 0  # reserved tokens no engine job has used yet
        self._closed = False

    def reserve(self, tokens: int) -> None:
        """Take `tokens` (the request's estimated prompt + max_tokens) from the tenant's bucket,
        or refuse the request with 429."""
        rate = self.tokens_per_minute
        if rate is None:
            return
        wait = wait_s(self.admission._bucket(self.tenant, rate), tokens, rate)
        if wait > 0:
            self.admission.metrics.rejected.labels("tenant_tokens").inc()
            if math.isinf(wait):
                raise rate_limited(
                    f"this request reserves about {tokens} tokens (prompt + max_tokens) but tenant {self.tenant!r} may "
                    f"spend at most {rate} tokens per minute; reduce the prompt or max_tokens", "tokens", None)
            seconds = retry_after_s(wait)
            raise rate_limited(
                f"tenant {self.tenant!r} is over its rate of {rate} tokens per minute (this request reserves about "
                f"{tokens}, prompt + max_tokens); try again in {seconds} s", "tokens", seconds)
        self.admission._charge(self.tenant, rate, tokens)
        self.unused += tokens

    def use(self, tokens: int) -> None:
        """An engine job of this request needs `tokens` (its prompt + max_tokens): drawn from the
        reservation, and what exceeds it charged all the same."""
        beyond = tokens - self.unused
        self.unused = max(0, -beyond)
        if beyond > 0 and self.tokens_per_minute is not None:
            self.admission._charge(self.tenant, self.tokens_per_minute, beyond)

    def close(self) -> None:
        """The request has ended: free its place and give back what it reserved and never used."""
        if self._closed:
            return
        self._closed = True
        self.admission._leave(self.tenant)
        if self.unused and self.tokens_per_minute is not None:
            self.admission._charge(self.tenant, self.tokens_per_minute, -self.unused)


class AdmissionMiddleware:
    """Authenticates /v1/ requests and admits the POSTs, before their bodies are read; the
    route finds `request.state.caller` and `request.state.ticket`."""

    def __init__(self, app, admission: Admission, api_keys=None):
        self.app = app
        self.admission = admission
        self.api_keys = api_keys  # ApiKeys or ApiKeysFile; None: no key is asked for

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        try:
            caller = self._caller(scope)
            limits = self.api_keys.limits_of(caller.tenant) if self.api_keys is not None else None
            ticket = self.admission.enter(caller.tenant, limits) if scope["method"] == "POST" else None
        except OpenAIError as error:
            return await send_error(send, error)
        state = scope.setdefault("state", {})
        state["caller"], state["ticket"] = caller, ticket
        try:
            await self.app(scope, receive, send)
        finally:
            if ticket is not None:
                ticket.close()

    def _caller(self, scope) -> Caller:
        if self.api_keys is None:
            return ANONYMOUS
        authorization = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, presented = authorization.partition(" ")
        found = self.api_keys.caller_of(presented.strip()) if scheme.lower() == "bearer" and presented.strip() else None
        if found is None:
            raise OpenAIError(401, "missing or incorrect API key: send 'Authorization: Bearer <key>'",
                              "invalid_request_error", "invalid_api_key")
        return found
