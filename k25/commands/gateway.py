"""`k25 gateway`: the OpenAI-compatible HTTP gateway in front of the engine pools."""

import os
import sys

from common.model_source import DEFAULT_MODEL


def register(subparsers) -> None:
    p = subparsers.add_parser("gateway", help="run the OpenAI-compatible HTTP gateway", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 in a pod)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"the model whose tokenizer and chat template to use, as the engines load it (default {DEFAULT_MODEL})")
    p.add_argument("--served-model-name", default=None, help="the `model` clients send (default: --model)")
    p.add_argument("--redis-url", default=os.environ.get("K25_REDIS_URL", "redis://127.0.0.1:6379/0"),
                   help="registry and QPS Redis (default: $K25_REDIS_URL or redis://127.0.0.1:6379/0)")
    p.add_argument("--release", default=os.environ.get("K25_RELEASE", "k25"), help="prefix of every Redis key (default k25)")
    p.add_argument("--api-keys-file", default=os.environ.get("K25_API_KEYS_FILE"),
                   help="JSON file of hashed API keys (see `k25 api-key`); without one no key is asked for")
    p.add_argument("--chunker-address", default=None, help="host:port of the chunker service")
    p.add_argument("--request-timeout-s", type=float, default=600.0, help="deadline of each request (default 600)")
    p.add_argument("--max-tokens-limit", type=int, default=8192, help="largest max_tokens accepted (default 8192)")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024, help="largest request body (default 8 MiB)")
    p.add_argument("--max-inflight", type=int, default=2048, help="requests in flight before 503 (default 2048)")
    p.add_argument("--prefix-index-max-blocks", type=int, default=262_144,
                   help="prompt block hashes remembered for cache-aware routing, about 130-180 bytes each (default 262144)")
    p.add_argument("--share-prefix-cache-across-tenants", action="store_true",
                   help="let tenants' requests reuse each other's cached prompts (default: each tenant's are its own)")
    p.add_argument("--log-level", default="warning", help="uvicorn's access and error log level (default warning)")
    p.set_defaults(handler=run)


def run(args) -> int:
    import redis
    import uvicorn

    from common.model_source import ModelLoadError
    from common.tokenizer import load_tokenizer
    from common.tracing import setup_tracing
    from services.gateway.api_keys import ApiKeys, ApiKeysError
    from services.gateway.app import create_app
    from services.gateway.service import Gateway
    from services.gateway.settings import GatewaySettings

    settings = GatewaySettings(
        model=args.model, served_model_name=args.served_model_name, redis_url=args.redis_url, release=args.release,
        api_keys_file=args.api_keys_file, chunker_address=args.chunker_address,
        request_timeout_s=args.request_timeout_s, max_tokens_limit=args.max_tokens_limit,
        max_body_bytes=args.max_body_bytes, max_inflight=args.max_inflight,
        prefix_index_max_blocks=args.prefix_index_max_blocks,
        share_prefix_cache_across_tenants=args.share_prefix_cache_across_tenants,
    )
    if settings.prefix_index_max_blocks < 1:
        print("k25 gateway: --prefix-index-max-blocks must be at least 1", file=sys.stderr)
        return 2
    try:
        tokenizer = load_tokenizer(settings.model)
        api_keys = ApiKeys.from_file(settings.api_keys_file) if settings.api_keys_file else None
    except (ModelLoadError, ApiKeysError) as exc:
        print(f"k25 gateway: {exc}", file=sys.stderr)
        return 2
    client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=0.5, socket_timeout=1.0)
    app = create_app(Gateway(settings, tokenizer, client), api_keys)
    tracing = setup_tracing("k25-gateway")
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    finally:
        if tracing is not None:
            tracing.shutdown()
    return 0
