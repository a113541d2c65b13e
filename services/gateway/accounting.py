"""Per-pool request counts for the operator's QPS, kept in memory and flushed to Redis.

Counts accumulate per (pool, epoch second) and a background task writes them once a
second. When Redis is unreachable they stay pending and go out with the next flush that
succeeds, so an outage shows up as late data rather than as a dip in QPS; buckets older
than Redis would keep them are dropped (the operator would no longer read them).
"""

import math
from collections import defaultdict
from dataclasses import dataclass

from k25.redis_keys import BUCKET_TTL_S, record_outcomes, record_requests


@dataclass
class SecondCounts:
    requests: int = 0
    completed: int = 0
    errors: int = 0
    latency_s_sum: float = 0.0


class RequestAccounting:
    def __init__(self, release: str):
        self.release = release
        self.pending: dict[tuple[str, int], SecondCounts] = defaultdict(SecondCounts)
        self.known_pools: set[str] = set()

    def arrived(self, pool: str, now: float) -> None:
        self.known_pools.add(pool)
        self.pending[(pool, math.floor(now))].requests += 1

    def finished(self, pool: str, now: float, latency_s: float, failed: bool) -> None:
        counts = self.pending[(pool, math.floor(now))]
        counts.completed += 1
        counts.errors += int(failed)
        counts.latency_s_sum += latency_s

    def take(self, now: float) -> dict[tuple[str, int], SecondCounts]:
        """Hand over what is pending (called on the event loop), with a zero bucket this second
        for each known pool (a quiet pool reads 0 QPS, not missing data)."""
        current = math.floor(now)
        for pool in self.known_pools:
            self.pending[(pool, current)]  # a zero bucket unless there is one already
        taken, self.pending = self.pending, defaultdict(SecondCounts)
        return taken

    def give_back(self, taken: dict[tuple[str, int], SecondCounts], now: float) -> None:
        """Put back what could not be written, except buckets older than Redis would keep."""
        oldest = math.floor(now) - BUCKET_TTL_S
        for key, counts in taken.items():
            if key[1] <= oldest:
                continue
            merged = self.pending[key]
            merged.requests += counts.requests
            merged.completed += counts.completed
            merged.errors += counts.errors
            merged.latency_s_sum += counts.latency_s_sum


def write_counts(redis, release: str, taken: dict[tuple[str, int], SecondCounts]) -> None:
    """One pipeline for all the buckets (runs in a worker thread; raises what Redis raises)."""
    pipe = redis.pipeline(transaction=False)
    for (pool, second), counts in taken.items():
        record_requests(pipe, release, pool, second, counts.requests)
        if counts.completed:
            record_outcomes(pipe, release, pool, second, counts.completed, counts.errors, counts.latency_s_sum)
    pipe.execute()
