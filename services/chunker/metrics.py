"""The chunker's Prometheus metrics (k25_chunker_*), in a registry of its own."""

from prometheus_client import Counter, Histogram

from common.metrics_http import MetricsEndpoint

_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BYTES_BUCKETS = tuple(float(1 << k) for k in range(10, 27, 2))  # 1 KiB .. 64 MiB


class ChunkerMetrics(MetricsEndpoint):
    def __init__(self):
        super().__init__()
        r = self.registry
        self.requests = Counter(
            "k25_chunker_requests", "Requests answered, by outcome (ok or the error code)", ["outcome"], registry=r
        )
        self.duration = Histogram(
            "k25_chunker_request_duration_seconds", "Tokenizing one document and cutting it into passages",
            buckets=_DURATION_BUCKETS, registry=r,
        )
        self.document_bytes = Histogram(
            "k25_chunker_document_bytes", "UTF-8 size of the documents split", buckets=_BYTES_BUCKETS, registry=r
        )
        # the metric keeps its name: each Chunk message it counts is one passage
        self.passages = Counter("k25_chunker_chunks", "Passages returned (Chunk messages)", registry=r)
        self.tokens = Counter("k25_chunker_tokens", "Document tokens split into passages", registry=r)
