"""What the predictive policy reads besides QPS: the pool's pods (how long each took from
creation to ready, which ones the scheduler could not place), its per-second QPS series
(the gateway's buckets), and the requests waiting in its engines and their recent time to
first token (their heartbeats)."""

import datetime

from common.redis_keys import live_engines, qps_bucket_key, within_limit
from operators.pool_status import unschedulable_reason
from operators.predictive_policy import PoolSignals


def startup_seconds(pod: dict) -> float | None:
    """Creation to the Ready condition turning True; None for a pod that is not ready."""
    created = pod.get("metadata", {}).get("creationTimestamp")
    for condition in pod.get("status", {}).get("conditions", []):
        if condition.get("type") == "Ready" and condition.get("status") == "True" and created:
            since = condition.get("lastTransitionTime")
            return max(0.0, (_parse(since) - _parse(created)).total_seconds()) if since else None
    return None


def pod_signals(pods: list[dict], now: float | None = None) -> PoolSignals:
    """What the pods say: start-up times of the ready ones, how many wait for a node, and (given
    the time now, in epoch seconds) how long ago the others were created."""
    startups = tuple(s for s in map(startup_seconds, pods) if s is not None)
    ages = () if now is None else tuple(
        max(0.0, now - _parse(created).timestamp()) for pod in pods
        if startup_seconds(pod) is None and (created := pod.get("metadata", {}).get("creationTimestamp"))
        and not pod.get("metadata", {}).get("deletionTimestamp"))
    return PoolSignals(startup_s=startups, unschedulable=sum(1 for p in pods if unschedulable_reason(p)),
                       starting_age_s=ages)


def qps_series(client, release: str, pool: str, now: float, window_s: int) -> tuple[float | None, ...]:
    """Requests per second for the last `window_s` complete seconds, oldest first; None where
    no gateway wrote a bucket."""
    current = int(now)
    values = client.mget([qps_bucket_key(release, pool, second) for second in range(current - window_s, current)])
    return tuple(None if value is None else float(value) for value in values)


def engine_signals(client, release: str, pool: str) -> tuple[int | None, float | None]:
    """From the pool's live engines' heartbeats: the requests waiting in them (None when none
    reports), and the worst of their TTFT p95s over the last minute (None when none saw a
    first token in it)."""
    entries = [entry for entry in live_engines(client, release).values() if entry.get("pool") == pool]
    # bounded as the gateway bounds them (ENTRY_LIMITS): a broken entry cannot size the pool
    counts = [n for n in (within_limit(e, "waiting") for e in entries) if n is not None]
    ttfts = [t for t in (within_limit(e, "ttft_p95_s", float) for e in entries) if t is not None]
    return (sum(counts) if counts else None), (max(ttfts) if ttfts else None)


def _parse(timestamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
