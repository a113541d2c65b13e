"""`k25 chunker`: cut documents into passages for gateways over ZMQ, with Prometheus metrics."""

import argparse
import logging
import signal
import sys
import threading

from k25.commands.chunk import DEFAULT_MODEL, add_passage_params

log = logging.getLogger("k25.chunker")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "chunker",
        help="cut documents into passages for gateways, over ZMQ",
        description="Load the model's tokenizer and answer ChunkRequests on a ZMQ ROUTER socket; Prometheus "
        "k25_chunker_* metrics on --metrics-port, and /healthz there for a liveness probe. The passage parameters "
        "below are the defaults for requests that leave them unset. SIGTERM or SIGINT shuts it down cleanly.",
    )
    p.add_argument("--zmq-port", type=int, default=5600, help="ROUTER port (default 5600)")
    p.add_argument("--bind-address", default="0.0.0.0",
                   help="interface the ZMQ ROUTER and the metrics port listen on, e.g. the pod IP or 127.0.0.1 "
                   "(default 0.0.0.0: every interface)")
    p.add_argument("--metrics-port", type=int, default=9600, help="Prometheus /metrics port; 0 turns it off (default 9600)")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"whose tokenizer counts the tokens (default {DEFAULT_MODEL})")
    p.add_argument(
        "--max-document-bytes", type=int, default=8 << 20,
        help="larger documents are refused with INVALID_ARGUMENT (default 8 MiB)",
    )
    p.add_argument("--stuck-after-s", type=float, default=120.0,
                   help="/healthz on the metrics port answers 503 once the serving loop has not come round for this "
                   "long, e.g. on a document that never ends (default 120)")
    add_passage_params(p)
    p.add_argument("--sndhwm", type=int, default=5000, help="ZMQ send high-water mark per peer (default 5000)")
    p.add_argument("--rcvhwm", type=int, default=5000, help="ZMQ receive high-water mark per peer (default 5000)")
    p.add_argument("--linger-ms", type=int, default=1000, help="how long unsent answers may delay shutdown (default 1000)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import zmq

    from common.model_source import ModelLoadError
    from common.tokenizer import load_tokenizer
    from common.tracing import setup_tracing
    from common.zmq_curve import keys_from_env
    from services.chunker.boundaries import ChunkParams
    from services.chunker.chunker import Chunker
    from services.chunker.metrics import ChunkerMetrics
    from services.chunker.server import ChunkerServer, ChunkerSettings

    try:
        if args.max_document_bytes < 1:
            raise ValueError(f"--max-document-bytes must be positive, got {args.max_document_bytes}")
        if not args.stuck_after_s > 0:
            raise ValueError(f"--stuck-after-s must be positive, got {args.stuck_after_s}")
        defaults = ChunkParams(args.passage_tokens, args.overlap_ratio, args.semantic_threshold)
        curve_secret_key = keys_from_env()
        chunker = Chunker(load_tokenizer(args.model))
    except (ValueError, ModelLoadError) as exc:  # CurveKeyError is a ValueError
        print(f"k25 chunker: {exc}", file=sys.stderr)
        return 2
    settings = ChunkerSettings(
        port=args.zmq_port, bind_host=args.bind_address, curve_secret_key=curve_secret_key, sndhwm=args.sndhwm, rcvhwm=args.rcvhwm, linger_ms=args.linger_ms,
        max_document_bytes=args.max_document_bytes, stuck_after_s=args.stuck_after_s, defaults=defaults,
    )
    metrics = ChunkerMetrics()
    try:
        server = ChunkerServer(chunker, settings, metrics)
    except zmq.ZMQError as exc:
        print(f"k25 chunker: cannot listen on ZMQ port {args.zmq_port} at {args.bind_address}: {exc}", file=sys.stderr)
        return 2
    try:
        metrics_port = metrics.serve(args.metrics_port, args.bind_address, server.health) if args.metrics_port else None
    except OSError as exc:
        server.close()
        print(f"k25 chunker: cannot serve metrics on port {args.metrics_port}: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log.info(
        "chunker: model %s, zmq port %d, metrics %s, max document %d bytes",
        args.model, server.port, f":{metrics_port}/metrics" if metrics_port else "off", args.max_document_bytes,
    )
    tracing = setup_tracing("k25-chunker")
    try:
        server.serve(stop)
    finally:
        log.info("chunker shutting down")
        server.close()
        metrics.close()
        if tracing is not None:
            tracing.shutdown()
    return 0
