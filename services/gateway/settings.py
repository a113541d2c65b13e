"""The gateway's settings (the `k25 gateway` flags)."""

from dataclasses import dataclass

from common.zmq_curve import CurveKeys


@dataclass(frozen=True)
class GatewaySettings:
    model: str = "smollm2-135m"  # whose tokenizer and chat template the gateway uses
    served_model_name: str | None = None  # the `model` clients send (default: `model`)
    redis_url: str = "redis://127.0.0.1:6379/0"
    release: str = "k25"
    api_keys_file: str | None = None
    chunker_address: str | None = None  # host:port of the chunker service
    chunker_timeout_s: float = 60.0
    registry_refresh_s: float = 0.5
    accounting_flush_s: float = 1.0
    request_timeout_s: float = 600.0
    default_max_tokens: int = 512  # when a chat request gives none (capped by the context)
    max_tokens_limit: int = 8192
    max_body_bytes: int = 8 * 1024 * 1024
    body_timeout_s: float = 30.0  # a request body must arrive within this; later: 408
    stream_stall_s: float = 30.0  # a streamed answer whose client takes nothing for this long is cancelled
    max_body_bytes_in_flight: int = 512 << 20  # what all the bodies held at once may take; beyond: 503
    max_inflight: int = 2048  # requests in flight beyond which new ones get 503 at once
    tokenizer_threads: int = 4  # threads that render chat templates and tokenise, off the event loop
    document_fanout: int = 8  # engine requests (one per passage) that one /v1/documents/ask runs at once
    max_document_passages: int = 256  # passages one question may read (its fan-out); more: 400
    document_passages_read: int = 4  # passages a question reads when it does not say (`passages` field)
    # stored documents (POST /v1/documents), in the release's Redis
    max_document_bytes: int = 4 << 20  # a document's text, UTF-8; more: 413
    max_tenant_document_bytes: int = 64 << 20  # text and passages of all a tenant's documents; more: 413
    max_tenant_documents: int = 1000  # documents a tenant may store at once; more: 400
    document_ttl_s: int = 7 * 24 * 3600  # a stored document expires this long after its upload
    engine_connect_timeout_s: float = 1.0
    zmq_sndhwm: int = 5000
    zmq_rcvhwm: int = 5000
    zmq_linger_ms: int = 1000
    curve_secret_key: CurveKeys | bytes | None = None  # the release's CURVE key(s), which engines and the chunker ask for
    # prefix-cache-aware routing: block hashes remembered (about 135-190 bytes each), and whether
    # tenants share cached prompts (False: each tenant's requests carry its name as cache salt)
    prefix_index_max_blocks: int = 262_144
    share_prefix_cache_across_tenants: bool = False
    # the engine pools (name, chunk_size) there are, also while one has no engine: its demand wakes it
    pools: tuple[tuple[str, int], ...] = ()
    # how long a request waits for an engine to register when none can take it (a pool scaling up from zero)
    engine_wait_s: float = 30.0
    # how long an error the gateway saw from an engine makes routing try other engines first
    engine_error_window_s: float = 30.0

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model
