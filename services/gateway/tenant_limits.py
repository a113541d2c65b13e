"""Each tenant's limits and the token bucket that meters its token rate. Pure functions.

A tenant may have at most `max_concurrent_requests` requests in flight and may spend
`tokens_per_minute` tokens (prompt + max_tokens of each request) on average. The bucket
holds at most a minute's worth and refills continuously; a request is admitted when the
bucket holds what it reserves. What a request turns out to use beyond its reservation is
charged anyway, so the bucket may go below zero: the tenant then waits until it is paid back.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TenantLimits:
    max_concurrent_requests: int | None = None  # None: no limit
    tokens_per_minute: int | None = None  # None: no limit


@dataclass(frozen=True)
class Bucket:
    level: float  # tokens that may be spent now; negative while the tenant owes some
    at: float  # the (monotonic) time `level` was computed for


def full_bucket(tokens_per_minute: int, now: float) -> Bucket:
    return Bucket(float(tokens_per_minute), now)


def refilled(bucket: Bucket, tokens_per_minute: int, now: float) -> Bucket:
    """The bucket at `now`: refilled at tokens_per_minute / 60 per second, up to a minute's worth."""
    level = bucket.level + max(0.0, now - bucket.at) * tokens_per_minute / 60.0
    return Bucket(min(float(tokens_per_minute), level), max(now, bucket.at))


def wait_s(bucket: Bucket, tokens: int, tokens_per_minute: int) -> float:
    """Seconds until a refilled `bucket` holds `tokens`: 0 when it does now, infinity when it
    never will (more than a minute's worth)."""
    if tokens > tokens_per_minute:
        return math.inf
    if tokens <= bucket.level:
        return 0.0
    return (tokens - bucket.level) * 60.0 / tokens_per_minute


def charged(bucket: Bucket, tokens: float, tokens_per_minute: int) -> Bucket:
    """`tokens` taken out (a negative amount gives tokens back, up to a minute's worth)."""
    return Bucket(min(float(tokens_per_minute), bucket.level - tokens), bucket.at)


def retry_after_s(wait: float) -> int:
    """Whole seconds for a Retry-After header: at least 1, never less than the wait."""
    return max(1, math.ceil(wait))
