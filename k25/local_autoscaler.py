"""`k25 up --autoscale`: the operator's autoscaling policy applied to local engine processes.

The same pure `decide` the operator runs on EnginePools, fed the same observation: the
pool's QPS from the gateway's Redis buckets, the engines requested (processes running)
and ready (registered in Redis). Only the mechanism differs: instead of patching a
Deployment's scale subresource it starts or stops `k25 engine` processes.
"""

from dataclasses import dataclass, field

from common.redis_keys import live_engines, pool_qps
from operators.autoscale_policy import PoolObservation, Recommendation, ScalingDecision, ScalingRules, decide


@dataclass
class LocalPool:
    name: str
    chunk_size: int
    rules: ScalingRules
    engines: list = field(default_factory=list)  # the pool's engine children, oldest first
    history: tuple[Recommendation, ...] = ()


def observe(client, release: str, pool: LocalPool, now: float, window_s: int) -> tuple[PoolObservation, set[str]]:
    """What the policy sees, and the names of the pool's engines that are ready (registered)."""
    registered = {engine_id for engine_id, entry in live_engines(client, release).items() if entry.get("pool") == pool.name}
    reading = pool_qps(client, release, pool.name, now, window_s=window_s)
    ready = {e.name for e in pool.engines if e.name in registered}
    seen = PoolObservation(
        now=now, replicas=len(pool.engines), ready_replicas=len(ready),
        qps=reading.qps, qps_age_s=reading.newest_bucket_age_s,
    )
    return seen, ready


def step(pool: LocalPool, seen: PoolObservation) -> ScalingDecision:
    decision = decide(pool.rules, seen, pool.history)
    pool.history = decision.history
    return decision


def engines_to_stop(pool: LocalPool, ready_names: set[str], count: int) -> list:
    """Which engines go when the pool shrinks: those still starting first, then the newest."""
    starting = [e for e in reversed(pool.engines) if e.name not in ready_names]
    ready = [e for e in reversed(pool.engines) if e.name in ready_names]
    return (starting + ready)[:count]

