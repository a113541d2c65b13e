"""`k25 gateway`: the OpenAI-compatible HTTP gateway in front of the engine pools."""

import functools
import os
import sys

from common.model_source import DEFAULT_MODEL
from k25.commands.up import _pool as pool_spec
from k25.commands.redis_flags import add_redis_flags


def register(subparsers) -> None:
    p = subparsers.add_parser("gateway", help="run the OpenAI-compatible HTTP gateway", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 in a pod)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"the model whose tokenizer and chat template to use, as the engines load it (default {DEFAULT_MODEL})")
    p.add_argument("--served-model-name", default=None, help="the `model` clients send (default: --model)")
    add_redis_flags(p, "registry and QPS Redis")
    p.add_argument("--api-keys-file", default=os.environ.get("K25_API_KEYS_FILE"),
                   help="JSON file of hashed API keys and tenant limits (see `k25 api-key`), re-read when it changes; "
                        "without one no key is asked for")
    p.add_argument("--chunker-address", default=None, help="host:port of the chunker service")
    p.add_argument("--chunker-timeout-s", type=float, default=60.0,
                   help="how long a document request waits for the chunker to cut its text; then 504, so that a hung "
                   "chunker costs its callers this long, not their whole deadline (default 60)")
    p.add_argument("--request-timeout-s", type=float, default=600.0, help="deadline of each request (default 600)")
    p.add_argument("--drain-timeout-s", type=float, default=None, metavar="SECONDS",
                   help="on SIGTERM the gateway stops accepting connections (its readiness fails) and lets the "
                   "requests in flight finish for this long, then cuts them (default: --request-timeout-s, so that "
                   "no request it admitted is cut)")
    p.add_argument("--max-tokens-limit", type=int, default=8192, help="largest max_tokens accepted (default 8192)")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024, help="largest request body (default 8 MiB)")
    p.add_argument("--body-timeout-s", type=float, default=30.0,
                   help="a request body must arrive within this many seconds of its request's start; later: 408, "
                   "so that slow clients give back their place (default 30)")
    p.add_argument("--stream-stall-s", type=float, default=30.0,
                   help="a streamed answer whose client takes nothing of it for this many seconds is cancelled at its "
                   "engine and gives back its place, so that a client that stops reading holds nothing (default 30)")
    p.add_argument("--max-body-bytes-in-flight", type=int, default=512 << 20,
                   help="what the request bodies held at once may take, each counted at its Content-Length (or "
                   "--max-body-bytes without one); a request beyond it gets 503 at once (default 512 MiB)")
    p.add_argument("--max-inflight", type=int, default=2048, help="requests in flight before 503 (default 2048)")
    p.add_argument("--tokenizer-threads", type=int, default=4,
                   help="threads that render chat templates and tokenise prompts, off the event loop (default 4)")
    p.add_argument("--document-fanout", type=int, default=8,
                   help="engine requests (one per passage) that one /v1/documents/ask runs at once (default 8)")
    p.add_argument("--max-document-passages", type=int, default=256,
                   help="passages one /v1/documents/ask may read, one engine request each (its fan-out); a question "
                   "asking for more is refused with 400 (default 256)")
    p.add_argument("--document-passages-read", type=int, default=4,
                   help="passages a /v1/documents/ask question reads when it does not say (its `passages` field): "
                   "the ones that bear most on the question (default 4)")
    p.add_argument("--max-document-bytes", type=int, default=4 << 20,
                   help="largest text POST /v1/documents stores, UTF-8 bytes; larger: 413 (default 4 MiB)")
    p.add_argument("--max-tenant-document-bytes", type=int, default=64 << 20,
                   help="what one tenant's stored documents may take in Redis, text and passages; past it: 413 "
                   "(default 64 MiB)")
    p.add_argument("--max-tenant-documents", type=int, default=1000,
                   help="documents one tenant may store at once; past it: 400 (default 1000)")
    p.add_argument("--document-ttl-s", type=int, default=7 * 24 * 3600,
                   help="a stored document is deleted this many seconds after its upload (default 604800, 7 days)")
    p.add_argument("--prefix-index-max-blocks", type=int, default=262_144,
                   help="prompt block hashes remembered for cache-aware routing, about 135-190 bytes each (default 262144)")
    p.add_argument("--share-prefix-cache-across-tenants", action="store_true",
                   help="let tenants' requests reuse each other's cached prompts (default: each tenant's are its own)")
    p.add_argument("--pool", dest="pools", type=pool_spec, action="append", default=[], metavar="NAME=CHUNK_SIZE",
                   help="an engine pool and its chunk_size, so that requests for it count as its demand (and wait for "
                        "an engine) while it has none; repeatable (pools seen in the registry are known anyway)")
    p.add_argument("--engine-wait-s", type=float, default=30.0,
                   help="how long a request waits for an engine to register when none can take it, e.g. while a pool "
                        "scales up from zero; then 503 with Retry-After (default 30; 0: answer 503 at once)")
    p.add_argument("--engine-error-window-s", type=float, default=30.0,
                   help="how long an engine that failed a request is tried after the others (default 30)")
    p.add_argument("--log-level", default="warning", help="uvicorn's access and error log level (default warning)")
    p.set_defaults(handler=run)


def run(args) -> int:
    import redis
    import uvicorn
    from uvicorn.main import STARTUP_FAILURE

    from common.model_source import ModelLoadError
    from common.tokenizer import load_tokenizer
    from common.tracing import setup_tracing
    from common.zmq_curve import CurveKeyError, keys_from_env
    from services.gateway.api_keys import ApiKeysError, ApiKeysFile
    from services.gateway.app import create_app
    from services.gateway.graceful_stop import Drain, DrainingH11Protocol
    from services.gateway.service import Gateway
    from services.gateway.settings import GatewaySettings

    try:
        curve_secret_key = keys_from_env()
    except CurveKeyError as exc:
        print(f"k25 gateway: {exc}", file=sys.stderr)
        return 2
    settings = GatewaySettings(
        model=args.model, served_model_name=args.served_model_name, redis_url=args.redis_url, release=args.release,
        api_keys_file=args.api_keys_file, chunker_address=args.chunker_address, chunker_timeout_s=args.chunker_timeout_s,
        request_timeout_s=args.request_timeout_s, max_tokens_limit=args.max_tokens_limit,
        max_body_bytes=args.max_body_bytes, max_inflight=args.max_inflight, body_timeout_s=args.body_timeout_s,
        stream_stall_s=args.stream_stall_s,
        max_body_bytes_in_flight=args.max_body_bytes_in_flight,
        tokenizer_threads=args.tokenizer_threads, document_fanout=args.document_fanout,
        max_document_passages=args.max_document_passages, document_passages_read=args.document_passages_read,
        max_document_bytes=args.max_document_bytes, max_tenant_document_bytes=args.max_tenant_document_bytes,
        max_tenant_documents=args.max_tenant_documents, document_ttl_s=args.document_ttl_s,
        prefix_index_max_blocks=args.prefix_index_max_blocks,
        share_prefix_cache_across_tenants=args.share_prefix_cache_across_tenants,
        pools=tuple(args.pools), engine_wait_s=args.engine_wait_s, engine_error_window_s=args.engine_error_window_s,
        curve_secret_key=curve_secret_key,
    )
    drain_timeout_s = settings.request_timeout_s if args.drain_timeout_s is None else args.drain_timeout_s
    problem = _bad_flags(settings) or ("--drain-timeout-s must be at least 0" if drain_timeout_s < 0 else None)
    if problem:
        print(f"k25 gateway: {problem}", file=sys.stderr)
        return 2
    try:
        tokenizer = load_tokenizer(settings.model)
        api_keys = ApiKeysFile(settings.api_keys_file) if settings.api_keys_file else None
    except (ModelLoadError, ApiKeysError) as exc:
        print(f"k25 gateway: {exc}", file=sys.stderr)
        return 2
    client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=0.5, socket_timeout=1.0)
    drain = Drain()
    app = create_app(Gateway(settings, tokenizer, client), api_keys, drain)
    tracing = setup_tracing("k25-gateway")
    server = uvicorn.Server(uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=drain_timeout_s,
        http=functools.partial(DrainingH11Protocol, drain=drain)))
    try:
        server.run()
    finally:
        if tracing is not None:
            tracing.shutdown()
    return 0 if server.started else STARTUP_FAILURE


def _bad_flags(settings) -> str | None:
    if settings.prefix_index_max_blocks < 1:
        return "--prefix-index-max-blocks must be at least 1"
    for flag, value in (("--max-inflight", settings.max_inflight), ("--tokenizer-threads", settings.tokenizer_threads),
                        ("--document-fanout", settings.document_fanout),
                        ("--max-document-passages", settings.max_document_passages),
                        ("--document-passages-read", settings.document_passages_read),
                        ("--max-document-bytes", settings.max_document_bytes),
                        ("--max-tenant-document-bytes", settings.max_tenant_document_bytes),
                        ("--max-tenant-documents", settings.max_tenant_documents),
                        ("--document-ttl-s", settings.document_ttl_s)):
        if value < 1:
            return f"{flag} must be at least 1"
    if len({name for name, _ in settings.pools}) != len(settings.pools):
        return "each --pool needs its own name"
    if not settings.chunker_timeout_s > 0:  # NaN too
        return "--chunker-timeout-s must be positive"
    if not settings.body_timeout_s > 0:
        return "--body-timeout-s must be positive"
    if not settings.stream_stall_s > 0:  # NaN too
        return "--stream-stall-s must be positive"
    if settings.max_body_bytes_in_flight < settings.max_body_bytes:
        return "--max-body-bytes-in-flight must be at least --max-body-bytes (or no body of that size could ever be read)"
    if not settings.engine_wait_s >= 0:  # NaN too
        return "--engine-wait-s must not be negative"
    if not settings.engine_error_window_s > 0:
        return "--engine-error-window-s must be positive"
    return None
