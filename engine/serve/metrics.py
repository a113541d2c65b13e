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
        self._seen: dict[Counter, int] = {}  # counter -> the engine's own count it was last brought up to

    def update_load(self, stats: EngineStats) -> None:
        self.running.set(stats.running)
        self.waiting.set(stats.waiting)
        self.kv_usage.set(stats.kv_usage)
        for counter, total in ((self.preemptions, stats.preemptions), (self.prefix_queries, stats.prefix_queried_tokens),
                               (self.prefix_hits, stats.prefix_hit_tokens), (self.prefix_evictions, stats.prefix_evicted_blocks)):
            seen = self._seen.get(counter, 0)
            if total > seen:
                counter.inc(total - seen)
                self._seen[counter] = total
