"""Request counts kept in memory and flushed to Redis once a second: per pool (the QPS the
operator scales on) and per adapter version and tenant (outcomes and latency, what the canary
analysis reads, weighing each tenant's: common/adapter_stats.py).

When Redis is unreachable the counts stay pending and go out with the next flush that
succeeds, so an outage shows up as late data rather than as a dip in QPS; buckets older
than Redis would keep them are dropped (nobody would read them any more).
"""

import math
from collections import defaultdict
from dataclasses import dataclass, field

from common.adapter_stats import record_version_outcomes
from common.redis_keys import BUCKET_TTL_S, record_requests


@dataclass
class VersionCounts:
    """One adapter version's finished requests in one second."""

    requests: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)

    def add(self, other: "VersionCounts") -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.latencies += other.latencies


@dataclass
class Pending:
    pools: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))  # (pool, second) -> requests
    # (adapter, version, tenant, second) -> outcomes
    versions: dict[tuple[str, str, str, int], VersionCounts] = field(default_factory=lambda: defaultdict(VersionCounts))


class RequestAccounting:
    def __init__(self, release: str):
        self.release = release
        self.pending = Pending()
        self.known_pools: set[str] = set()

    def arrived(self, pool: str, now: float) -> None:
        self.known_pools.add(pool)
        self.pending.pools[(pool, math.floor(now))] += 1

    def finished(self, adapter: str, version: str, now: float, latency_s: float, failed: bool, tenant: str) -> None:
        """A request of `tenant` (its API key's) to an adapter version ended (requests to the base
        model have no outcome bucket: nothing reads one)."""
        counts = self.pending.versions[(adapter, version, tenant, math.floor(now))]
        counts.requests += 1
        counts.errors += int(failed)
        counts.latencies.append(latency_s)

    def take(self, now: float) -> Pending:
        """Hand over what is pending (called on the event loop), with a zero bucket this second
        for each known pool (a quiet pool reads 0 QPS, not missing data)."""
        current = math.floor(now)
        for pool in self.known_pools:
            self.pending.pools[(pool, current)] += 0  # a zero bucket unless there is one already
        taken, self.pending = self.pending, Pending()
        return taken

    def give_back(self, taken: Pending, now: float) -> None:
        """Put back what could not be written, except buckets older than Redis would keep."""
        oldest = math.floor(now) - BUCKET_TTL_S
        for key, requests in taken.pools.items():
            if key[-1] > oldest:
                self.pending.pools[key] += requests
        for key, counts in taken.versions.items():
            if key[-1] > oldest:
                self.pending.versions[key].add(counts)


def write_counts(redis, release: str, taken: Pending) -> None:
    """One pipeline for all the buckets (runs in a worker thread; raises what Redis raises)."""
    pipe = redis.pipeline(transaction=False)
    for (pool, second), requests in taken.pools.items():
        record_requests(pipe, release, pool, second, requests)
    for (adapter, version, tenant, second), counts in taken.versions.items():
        record_version_outcomes(pipe, release, adapter, version, second, counts.requests, counts.errors, counts.latencies,
                                tenant)
    pipe.execute()
