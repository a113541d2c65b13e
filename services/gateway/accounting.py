"""Request counts kept in memory and flushed to Redis once a second: per pool (the QPS the
operator scales on, with completions, errors and latency) and per adapter version (what
the canary analysis reads).

When Redis is unreachable the counts stay pending and go out with the next flush that
succeeds, so an outage shows up as late data rather than as a dip in QPS; buckets older
than Redis would keep them are dropped (nobody would read them any more).
"""

import math
from collections import defaultdict
from dataclasses import dataclass, field

from common.redis_keys import BUCKET_TTL_S, record_outcomes, record_requests
from common.rollout_keys import record_version_outcomes


@dataclass
class SecondCounts:
    """One pool's requests in one second."""

    requests: int = 0
    completed: int = 0
    errors: int = 0
    latency_s_sum: float = 0.0

    def add(self, other: "SecondCounts") -> None:
        self.requests += other.requests
        self.completed += other.completed
        self.errors += other.errors
        self.latency_s_sum += other.latency_s_sum


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
    pools: dict[tuple[str, int], SecondCounts] = field(default_factory=lambda: defaultdict(SecondCounts))
    versions: dict[tuple[str, str, int], VersionCounts] = field(default_factory=lambda: defaultdict(VersionCounts))


class RequestAccounting:
    def __init__(self, release: str):
        self.release = release
        self.pending = Pending()
        self.known_pools: set[str] = set()

    def arrived(self, pool: str, now: float) -> None:
        self.known_pools.add(pool)
        self.pending.pools[(pool, math.floor(now))].requests += 1

    def finished(self, pool: str, now: float, latency_s: float, failed: bool,
                 adapter_version: tuple[str, str] | None = None) -> None:
        second = math.floor(now)
        counts = self.pending.pools[(pool, second)]
        counts.completed += 1
        counts.errors += int(failed)
        counts.latency_s_sum += latency_s
        if adapter_version is not None:
            version = self.pending.versions[(*adapter_version, second)]
            version.requests += 1
            version.errors += int(failed)
            version.latencies.append(latency_s)

    def take(self, now: float) -> Pending:
        """Hand over what is pending (called on the event loop), with a zero bucket this second
        for each known pool (a quiet pool reads 0 QPS, not missing data)."""
        current = math.floor(now)
        for pool in self.known_pools:
            self.pending.pools[(pool, current)]  # a zero bucket unless there is one already
        taken, self.pending = self.pending, Pending()
        return taken

    def give_back(self, taken: Pending, now: float) -> None:
        """Put back what could not be written, except buckets older than Redis would keep."""
        oldest = math.floor(now) - BUCKET_TTL_S
        for key, counts in taken.pools.items():
            if key[-1] > oldest:
                self.pending.pools[key].add(counts)
        for key, counts in taken.versions.items():
            if key[-1] > oldest:
                self.pending.versions[key].add(counts)


def write_counts(redis, release: str, taken: Pending) -> None:
    """One pipeline for all the buckets (runs in a worker thread; raises what Redis raises)."""
    pipe = redis.pipeline(transaction=False)
    for (pool, second), counts in taken.pools.items():
        record_requests(pipe, release, pool, second, counts.requests)
        if counts.completed:
            record_outcomes(pipe, release, pool, second, counts.completed, counts.errors, counts.latency_s_sum)
    for (adapter, version, second), counts in taken.versions.items():
        record_version_outcomes(pipe, release, adapter, version, second, counts.requests, counts.errors, counts.latencies)
    pipe.execute()
