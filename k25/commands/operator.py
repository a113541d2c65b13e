"""`k25 operator`: run the operator (EnginePools and AdapterRollouts) against the current kube context (or the
service account when it runs in a pod)."""

import os


def register(subparsers) -> None:
    parser = subparsers.add_parser("operator", help="run the operator for EnginePools and AdapterRollouts (kopf)", description=__doc__)
    parser.add_argument("--namespace", "-n", action="append", default=[],
                       help="watch this namespace (repeatable); default: the whole cluster")
    parser.add_argument("--release", default=os.environ.get("K25_RELEASE", "k25"),
                        help="release name, the prefix of every Redis key (default: $K25_RELEASE or k25)")
    parser.add_argument("--redis-url", default=os.environ.get("K25_REDIS_URL", "redis://127.0.0.1:6379/0"),
                        help="where the gateways count requests (default: $K25_REDIS_URL)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between autoscaling decisions")
    parser.add_argument("--priority", type=int, default=None,
                        help="peering priority; the highest live operator works, the others stand by "
                             "(default: random, so two replicas never tie)")
    parser.add_argument("--standalone", action="store_true",
                        help="no peering: for a single operator without the KopfPeering CRD")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from operators.config import OperatorConfig
    from operators.runtime import run_operator  # kopf loads only for this command

    if not args.interval > 0:
        raise SystemExit("k25 operator: --interval must be positive")
    config = OperatorConfig(release=args.release, redis_url=args.redis_url, interval_s=args.interval)
    run_operator(config, namespaces=args.namespace, priority=args.priority, standalone=args.standalone)
    return 0
