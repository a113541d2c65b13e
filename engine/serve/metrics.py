"""The engine's Prometheus metrics, served on a small HTTP port beside its ZMQ port."""

from prometheus_client import Counter, Gauge, Histogram

from common.metrics_http import MetricsEndpoint
from engine.serve.registry import EngineStats

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_INTER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class EngineMetrics(MetricsEndpoint):
    def __init__(self):
        super().__init__()
        r = self.registry
        self.running = Gauge("k25_engine_running_requests", "Requests the scheduler is running", registry=r)
        self.waiting = Gauge("k25_engine_waiting_requests", "Requests queued for a first step", registry=r)
        self.kv_usage = Gauge("k25_engine_kv_usage_ratio", "Fraction of KV cache blocks in use (0..1)", registry=r)
        self.time_to_first_token = Histogram(
            "k25_engine_time_to_first_token_seconds", "Admission to first generated token", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.inter_token_latency = Histogram(
            "k25_engine_inter_token_latency_seconds", "Time between consecutive tokens of a request",
            buckets=_INTER_TOKEN_BUCKETS, registry=r,
        )
        self.request_duration = Histogram(
            "k25_engine_request_duration_seconds", "Admission to the final message", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.preemptions = Counter("k25_engine_preemptions", "Sequences preempted to free KV blocks", registry=r)
        self.requests_finished = Counter(
            "k25_engine_requests_finished", "Requests that ended, by finish reason", ["finish_reason"], registry=r
        )
        self.request_errors = Counter(
            "k25_engine_request_errors", "Requests (or frames) answered with an Error, by code", ["code"], registry=r
        )
        self.prefix_queries = Counter(
            "k25_engine_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", registry=r
        )
        self.prefix_hits = Counter("k25_engine_prefix_cache_hits", "Prompt tokens found in the prefix cache", registry=r)
        self.prefix_evictions = Counter(
            "k25_engine_prefix_cache_evictions", "Cached KV blocks taken for new KV", registry=r
        )
        self.tier_blocks = Gauge("k25_engine_kv_tier_blocks", "KV blocks each tier below the device holds", ["tier"],
                                 registry=r)
        self.tier_bytes = Gauge("k25_engine_kv_tier_bytes", "Bytes of KV each tier below the device holds", ["tier"],
                                registry=r)
        self.tier_hits = Counter("k25_engine_kv_tier_hits", "Prompt tokens found cached, by the tier that held them",
                                 ["tier"], registry=r)
        self.tier_copied = Counter("k25_engine_kv_tier_copied_bytes", "Bytes of KV copied between tiers, by direction",
                                   ["direction"], registry=r)
        self.tier_copy_seconds = Counter("k25_engine_kv_tier_copy_seconds",
                                         "Time the engine thread spent issuing copies between KV tiers", registry=r)
        self.tier_dropped = Counter("k25_engine_kv_tier_dropped_blocks",
                                    "Stored KV blocks found unreadable (checksum, truncation, I/O) and recomputed",
                                    registry=r)
        self.unusable_rollout_states = Gauge(
            "k25_engine_unusable_rollout_states", "Adapters whose rollout state in Redis breaks the contract (a malformed "
            "name or hash): skipped, each keeps the versions it holds", registry=r)
        self._seen: dict[object, float] = {}  # counter -> the engine's own count it was last brought up to

    def update_load(self, stats: EngineStats) -> None:
        self.running.set(stats.running)
        self.waiting.set(stats.waiting)
        self.kv_usage.set(stats.kv_usage)
        for counter, total in ((self.preemptions, stats.preemptions), (self.prefix_queries, stats.prefix_queried_tokens),
                               (self.prefix_hits, stats.prefix_hit_tokens), (self.prefix_evictions, stats.prefix_evicted_blocks)):
            self._bring_up(counter, total)
        lower = dict(stats.kv_tier_hit_tokens)
        if lower:
            self._bring_up(self.tier_hits.labels("device"), stats.prefix_hit_tokens - sum(lower.values()))
        for tier, tokens in lower.items():
            self._bring_up(self.tier_hits.labels(tier), tokens)
        for tier, blocks, nbytes in stats.kv_tier_blocks:
            self.tier_blocks.labels(tier).set(blocks)
            self.tier_bytes.labels(tier).set(nbytes)
        for direction, nbytes in stats.kv_tier_copied_bytes:
            self._bring_up(self.tier_copied.labels(direction), nbytes)
        self._bring_up(self.tier_copy_seconds, stats.kv_tier_copy_seconds)
        self._bring_up(self.tier_dropped, stats.kv_tier_dropped_blocks)

    def _bring_up(self, counter, total: float) -> None:
        """Raise `counter` to the engine's own running `total`."""
        seen = self._seen.get(counter, 0)
        if total > seen:
            counter.inc(total - seen)
            self._seen[counter] = total
