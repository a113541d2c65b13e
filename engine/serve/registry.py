"""What an engine tells the registry about itself: fixed facts plus a snapshot of its load.

The facts include the limits by which a gateway judges the engine (its admission limits
and its heartbeat's TTL): the engine's settings are their one source, gateways keep no
copies, so an engine started with other limits is judged by its own. Its health (see
engine/serve/health.py) is judged when the entry is written, not when the load was last seen: a
wedged step stops the serving thread from updating anything."""

from dataclasses import dataclass

from engine.serve.health import FRESH, HealthReport


@dataclass(frozen=True)
class EngineProfile:
    """Facts about an engine that do not change while it runs."""

    engine_id: str
    address: str  # host:port the gateway dials (a DEALER connects to tcp://{address})
    pool: str
    node_type: str
    model: str
    chunk_size: int
    max_chunk_per_gpu: int
    capacity_tokens: int
    max_model_len: int  # prompt + max_tokens of one request may not exceed this
    kv_admission_limit: float  # KV use above which new requests get RESOURCE_EXHAUSTED
    max_waiting: int  # queued requests at which new ones get RESOURCE_EXHAUSTED
    heartbeat_ttl_s: float  # how long the entry outlives its last refresh
    block_size: int = 16  # tokens per KV block: the unit of its prefix-cache hashes
    prefix_caching: bool = True
    incarnation: str = ""  # new at every start: a restarted engine's cache starts empty
    dtype: str = ""  # what it computes in (engines of a pool must agree: the same request, the same tokens)


@dataclass(frozen=True)
class EngineStats:
    """The engine's load, as the server loop last saw it."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # fraction of KV blocks in use
    preemptions: int = 0
    adapters: tuple[str, ...] = ()  # name@version of the adapters it serves
    # prefix cache since start: prompt tokens looked up, found, and cached blocks evicted
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    prefix_evicted_blocks: int = 0
    ttft_p95_s: float | None = None  # admission to first token, over the last minute; None: no first token in it
    # KV tiers below the device (engine/core/contract.py's EngineLoad)
    kv_tier_hit_tokens: tuple[tuple[str, int], ...] = ()
    kv_tier_blocks: tuple[tuple[str, int, int], ...] = ()
    kv_tier_copied_bytes: tuple[tuple[str, int], ...] = ()
    kv_tier_copy_seconds: float = 0.0
    kv_tier_dropped_blocks: int = 0

    def tier_hit_share(self) -> dict[str, float]:
        """Of the prompt tokens found cached, the share each tier gave: device, host, disk."""
        lower = dict(self.kv_tier_hit_tokens)
        found = {"device": self.prefix_hit_tokens - sum(lower.values()), **lower}
        total = sum(found.values())
        return {tier: round(n / total, 4) if total else 0.0 for tier, n in found.items()}

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_queried_tokens if self.prefix_queried_tokens else 0.0


def registry_entry(profile: EngineProfile, stats: EngineStats, health: HealthReport = FRESH) -> dict:
    return {
        "engine_id": profile.engine_id,
        "address": profile.address,
        "pool": profile.pool,
        "node_type": profile.node_type,
        "model": profile.model,
        "chunk_size": profile.chunk_size,
        "max_chunk_per_gpu": profile.max_chunk_per_gpu,
        "capacity_tokens": profile.capacity_tokens,
        "max_model_len": profile.max_model_len,
        "kv_admission_limit": profile.kv_admission_limit,
        "max_waiting": profile.max_waiting,
        "heartbeat_ttl_s": profile.heartbeat_ttl_s,
        "free_kv_fraction": round(1.0 - stats.kv_usage, 6),
        "running": stats.running,
        "waiting": stats.waiting,
        "adapters": list(stats.adapters),
        "block_size": profile.block_size,
        "prefix_caching": profile.prefix_caching,
        "incarnation": profile.incarnation,
        "dtype": profile.dtype,
        "prefix_cache_hit_rate": round(stats.prefix_hit_rate, 4),
        "kv_tier_hit_share": stats.tier_hit_share(),
        "kv_tiers": [tier for tier, _, _ in stats.kv_tier_blocks],
        "ttft_p95_s": None if stats.ttft_p95_s is None else round(stats.ttft_p95_s, 4),
        **health.fields(),
    }
