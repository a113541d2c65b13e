"""The gateway's Prometheus metrics (k25_gateway_*), on its own registry."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "k25_gateway_requests", "Requests answered, by pool and HTTP status", ["pool", "status"], registry=self.registry
        )
        self.rejected = Counter(
            "k25_gateway_rejected", "Requests refused before reaching an engine, by reason", ["reason"], registry=self.registry
        )
        self.latency = Histogram(
            "k25_gateway_request_latency_seconds", "End-to-end request latency", ["pool"],
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.ttft = Histogram(
            "k25_gateway_time_to_first_token_seconds", "Time from request to first token", ["pool"],
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.lora_requests = Counter(
            "k25_lora_requests", "Requests to LoRA adapters, by version, canary group and HTTP status",
            ["adapter_name", "adapter_version", "ab_group", "status"], registry=self.registry,
        )
        self.lora_latency = Histogram(
            "k25_lora_inference_latency_seconds", "End-to-end latency of successful requests to LoRA adapters",
            ["adapter_name", "ab_group"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.inflight = Gauge("k25_gateway_inflight_requests", "Requests in flight", registry=self.registry)
        self.body_bytes_in_flight = Gauge(
            "k25_gateway_body_bytes_in_flight", "What the request bodies in flight may hold (each at its Content-Length)",
            registry=self.registry)
        self.engines = Gauge("k25_gateway_live_engines", "Engines in the registry, by pool", ["pool"], registry=self.registry)
        self.prefix_routing = Counter(
            "k25_gateway_prefix_routing", "Requests by what the prefix index expected of the engine chosen and what it "
            "reported: hit (expected cached, was), miss (expected cached, was not: a stale index), unexpected_hit, none",
            ["result"], registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "k25_gateway_prompt_tokens", "Prompt tokens of the requests engines finished (pads excluded), by pool",
            ["pool"], registry=self.registry)
        self.cached_prompt_tokens = Counter(
            "k25_gateway_cached_prompt_tokens", "Of those, the tokens whose KV an engine already held, by pool and the "
            "KV tier it came from (device, host, disk)", ["pool", "tier"], registry=self.registry)
        self.prefix_index_blocks = Gauge(
            "k25_gateway_prefix_index_blocks", "Block hashes in the cache-aware routing index", registry=self.registry
        )
        self.tokenize_seconds = Histogram(
            "k25_gateway_tokenize_seconds", "Time to render and tokenise one prompt, the wait for a tokenizer thread included",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, *LATENCY_BUCKETS[2:]), registry=self.registry,
        )
        self.redis_up = Gauge("k25_gateway_redis_up", "1 when the last registry read from Redis succeeded", registry=self.registry)
        self.unroutable_engines = Gauge(
            "k25_gateway_unroutable_engines", "Engines in the registry that routing leaves out, by pool and reason "
            "(unhealthy, draining)", ["pool", "reason"], registry=self.registry,
        )
        self.stalled_streams = Counter(
            "k25_gateway_stalled_streams", "Streamed answers cancelled because their client took nothing of them for "
            "--stream-stall-s", registry=self.registry,
        )
        self.engine_retries = Counter(
            "k25_gateway_engine_retries", "Requests tried on another engine because one refused or failed them before "
            "their first token, by why (the engine's error code, unreachable, lost)", ["reason"], registry=self.registry,
        )
        self.waiting_for_engine = Gauge(
            "k25_gateway_waiting_for_engine", "Requests waiting for an engine to register (a pool starting from zero)",
            registry=self.registry,
        )
        self.engine_waits = Counter(
            "k25_gateway_engine_waits", "Requests that waited for an engine to register, by outcome (served, timed_out)",
            ["outcome"], registry=self.registry,
        )
