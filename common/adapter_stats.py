"""The outcomes of requests per adapter version, written by the gateways for each epoch second and
read by the operator's canary checks (`common.rollout_keys` holds the rollout state itself).

    {release}:adapter_stats:{adapter}@{version}:{epoch_second}     hash, TTL 300 s
        requests        requests that finished in that second
        errors          how many of them failed
        latency_s_sum   their summed end-to-end latency in seconds
        le_0.05 le_0.1 le_0.25 le_0.5 le_1 le_2.5 le_5 le_10 le_inf
                        latency histogram, NOT cumulative: each latency adds 1 to exactly
                        one bucket, the first whose bound is >= it (le_0.1 counts
                        latencies in (0.05, 0.1]); Prometheus' cumulative counts are the
                        running sums of these
        requests|{tenant} errors|{tenant} le_...|{tenant}
                        the same counts for the requests of one tenant (the tenant of the
                        caller's API key: an identity the client cannot choose)

`version_stats` sums the complete seconds of a window and takes the p95 from the buckets.

A client can choose `user` values that place its requests on the canary (or on stable), then
send requests that fail there (to roll a good canary back) or many that succeed (to hide the
failures others see and get a bad one promoted). Weighed by tenant (`max_requests_per_tenant`),
the checks read what the tenants see, not what one of them sends:

- each tenant's requests count in the error rate and the p95 with the weight of at most that
  many requests: a tenant that sent more counts as much as any other busy tenant, never more;
- with two tenants or more, the error rate and the p95 are each the lowest that leaving one
  tenant out gives: a failure only one tenant sees cannot fail a check alone (it still shows
  in that tenant's metrics), while one that two tenants see does, however many successes a
  third sends.

The requests that a gateway wrote without tenants count as one tenant more. A release with a
single tenant (or an anonymous gateway, whose callers are one tenant) is read as it is.
`requests` and `errors` stay the plain counts (a check needs `minRequestsPerStep` requests).
"""

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction

from common.rollout_keys import versioned_name

ADAPTER_STATS_TTL_S = 300
# (hash field, upper bound in seconds), in increasing order
LATENCY_BUCKETS = (("le_0.05", 0.05), ("le_0.1", 0.1), ("le_0.25", 0.25), ("le_0.5", 0.5), ("le_1", 1.0),
                   ("le_2.5", 2.5), ("le_5", 5.0), ("le_10", 10.0), ("le_inf", math.inf))
BUCKET_BOUNDS_S = tuple(bound for _, bound in LATENCY_BUCKETS)
TENANT_SEPARATOR = "|"


def adapter_stats_key(release: str, adapter: str, version: str, epoch_second: int) -> str:
    return f"{release}:adapter_stats:{versioned_name(adapter, version)}:{epoch_second}"


def record_version_outcomes(pipe, release: str, adapter: str, version: str, epoch_second: int,
                            requests: int, errors: int, latencies: list[float], tenant: str | None = None) -> None:
    """Add the outcomes of requests to one adapter version that finished in `epoch_second`
    on a Redis pipeline (or client); the caller executes the pipeline. `latencies` are
    end-to-end seconds, one per request (failed requests may be left out). With a `tenant`,
    they are also counted as that tenant's."""
    for name, count in (("requests", requests), ("errors", errors)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {count!r}")
    if errors > requests:
        raise ValueError(f"errors ({errors}) must not exceed requests ({requests})")
    if isinstance(epoch_second, bool) or not isinstance(epoch_second, int):
        raise ValueError(f"epoch_second must be an integer, got {epoch_second!r}")
    if any(not latency >= 0 for latency in latencies):  # also refuses NaN
        raise ValueError(f"latencies must be non-negative seconds, got {[x for x in latencies if not x >= 0][:3]}")
    counts = [0] * len(LATENCY_BUCKETS)
    for latency in latencies:
        counts[bisect.bisect_left(BUCKET_BOUNDS_S, latency)] += 1  # the first bound >= latency
    key = adapter_stats_key(release, adapter, version, epoch_second)
    suffixes = ("",) if tenant is None else ("", TENANT_SEPARATOR + tenant)
    for suffix in suffixes:
        pipe.hincrby(key, "requests" + suffix, requests)
        pipe.hincrby(key, "errors" + suffix, errors)
        for (name, _), count in zip(LATENCY_BUCKETS, counts):
            if count:
                pipe.hincrby(key, name + suffix, count)
    pipe.hincrbyfloat(key, "latency_s_sum", math.fsum(latencies))
    pipe.expire(key, ADAPTER_STATS_TTL_S)


@dataclass(frozen=True)
class VersionStats:
    requests: int
    errors: int
    error_rate: float | None  # errors / requests (weighed by tenant when asked); None without requests
    p95_latency_s: float | None  # upper bound of the bucket holding the p95 (inf: above 10 s); None: no latencies


@dataclass
class Outcomes:
    """The counts of one tenant's requests (or of all requests) to one version over a window."""

    requests: int = 0
    errors: int = 0
    histogram: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))

    def add(self, name: str, count: int) -> None:
        if name in ("requests", "errors"):
            setattr(self, name, getattr(self, name) + count)
        elif name in _BUCKET_INDEX:
            self.histogram[_BUCKET_INDEX[name]] += count


_BUCKET_INDEX = {name: i for i, (name, _) in enumerate(LATENCY_BUCKETS)}


def p95_upper_bound(histogram) -> float | None:
    """The upper bound of the bucket that holds the 95th percentile by nearest rank (the
    ceil(0.95 n)-th smallest latency), from per-bucket counts in LATENCY_BUCKETS order (integers,
    or exact weights as Fractions)."""
    total = sum(histogram)
    if total == 0:
        return None
    rank = Fraction(95, 100) * total  # exact: a running sum of integers reaches it at ceil(0.95 n)
    seen = 0
    for (_, bound), count in zip(LATENCY_BUCKETS, histogram):
        seen += count
        if seen >= rank:
            return bound
    raise AssertionError("unreachable: the running sum reaches the total")


def weighed_stats(tenants: list[Outcomes], max_requests_per_tenant: int) -> VersionStats:
    """The stats of a version whose tenants' outcomes are `tenants`, each tenant weighing as much
    as min(its requests, max_requests_per_tenant) (its errors and latencies scaled by that weight
    over its requests). With two tenants or more, the error rate and the p95 are each the lowest
    that leaving one tenant out gives: what one tenant alone does cannot fail a check."""
    if max_requests_per_tenant < 1:
        raise ValueError(f"max_requests_per_tenant must be at least 1, got {max_requests_per_tenant}")
    weighed = []  # (weight, errors, histogram) of each tenant with requests, scaled by its weight
    for t in tenants:
        if t.requests:
            scale = Fraction(min(t.requests, max_requests_per_tenant), t.requests)
            weighed.append((scale * t.requests, scale * t.errors, [scale * n for n in t.histogram]))
    weight = sum(w for w, _, _ in weighed)
    errors = sum(e for _, e, _ in weighed)
    histogram = [sum(h[i] for _, _, h in weighed) for i in range(len(LATENCY_BUCKETS))]
    if len(weighed) < 2:
        error_rate, p95 = (errors / weight if weight else None), p95_upper_bound(histogram)
    else:
        error_rate = min((errors - e) / (weight - w) for w, e, _ in weighed)
        p95s = [p95_upper_bound([n - h[i] for i, n in enumerate(histogram)]) for _, _, h in weighed]
        p95 = min((p for p in p95s if p is not None), default=None)
    return VersionStats(requests=sum(t.requests for t in tenants), errors=sum(t.errors for t in tenants),
                        error_rate=None if error_rate is None else float(error_rate), p95_latency_s=p95)


def version_stats(redis, release: str, adapter: str, version: str, now: float, window_s: int,
                  max_requests_per_tenant: int | None = None) -> VersionStats:
    """The outcomes of one adapter version over the `window_s` complete seconds before `now`
    (the current second is still being written and is left out); weighed by tenant when
    `max_requests_per_tenant` is given (weighed_stats)."""
    if isinstance(window_s, bool) or not isinstance(window_s, int) or not 1 <= window_s <= ADAPTER_STATS_TTL_S:
        raise ValueError(f"window_s must be an integer from 1 to {ADAPTER_STATS_TTL_S} (the buckets' TTL), "
                         f"got {window_s!r}")
    current = math.floor(now)
    pipe = redis.pipeline(transaction=False)
    for back in range(1, window_s + 1):
        pipe.hgetall(adapter_stats_key(release, adapter, version, current - back))
    total, by_tenant = Outcomes(), defaultdict(Outcomes)
    for raw in pipe.execute():
        for key, value in raw.items():
            name, separator, tenant = _text(key).partition(TENANT_SEPARATOR)
            if name == "latency_s_sum":
                continue
            (by_tenant[tenant] if separator else total).add(name, int(value))
    if max_requests_per_tenant is None:
        return VersionStats(requests=total.requests, errors=total.errors,
                            error_rate=total.errors / total.requests if total.requests else None,
                            p95_latency_s=p95_upper_bound(total.histogram))
    tenants = by_tenant.values()
    unattributed = Outcomes(max(0, total.requests - sum(t.requests for t in tenants)),
                            max(0, total.errors - sum(t.errors for t in tenants)),
                            [max(0, n - sum(t.histogram[i] for t in tenants)) for i, n in enumerate(total.histogram)])
    return weighed_stats([*tenants, unattributed], max_requests_per_tenant)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
