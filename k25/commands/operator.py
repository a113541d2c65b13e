"""`k25 operator`: run the operator (EnginePools and AdapterRollouts) against the current kube context (or the
service account when it runs in a pod). It handles only the resources labelled k25.io/release=<release>."""

import os
from k25.commands.redis_flags import add_redis_flags


def register(subparsers) -> None:
    parser = subparsers.add_parser("operator", help="run the operator for EnginePools and AdapterRollouts (kopf)", description=__doc__)
    parser.add_argument("--namespace", "-n", action="append", default=[],
                       help="watch this namespace (repeatable); default: the whole cluster. With namespaces, the "
                            "operator needs no cluster-wide permission and keeps its peering record (a KopfPeering) "
                            "in each of them")
    add_redis_flags(parser, "where the gateways count requests",
                    "release name: the prefix of every Redis key, and the k25.io/release label of the "
                    "EnginePools and AdapterRollouts this operator handles")
    parser.add_argument("--redis-secret", default=os.environ.get("K25_REDIS_SECRET") or None,
                        help="the Secret, in each pool's namespace, whose key redis-url the engines read as "
                             "K25_REDIS_URL (default: $K25_REDIS_SECRET); without one they get --redis-url as a "
                             "plain value, which must then carry no password")
    parser.add_argument("--redis-ca-secret", default=os.environ.get("K25_REDIS_CA_SECRET") or None,
                        help="the Secret, in each pool's namespace, whose key ca.crt the engines mount where their "
                             "rediss:// URL's ssl_ca_certs names it (a Redis that speaks TLS; default: "
                             "$K25_REDIS_CA_SECRET)")
    parser.add_argument("--curve-secret", default=os.environ.get("K25_CURVE_SECRET") or None,
                        help="the Secret, in each pool's namespace, whose key curve-secret-key the engines read as "
                             "K25_CURVE_SECRET_KEY: they then admit only gateways that hold that CURVE key (default: "
                             "$K25_CURVE_SECRET); without one the engines run plain ZMQ and admit any peer")
    parser.add_argument("--allowed-image", dest="allowed_images", action="append", default=[], metavar="REPOSITORY",
                        help="an image repository EnginePools may run (any tag or digest of it), or a prefix ending "
                             "in /* (every repository under it); repeatable. A pool naming another image is refused "
                             "(its engines would get the release's Redis and CURVE secrets). Default: any image")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between autoscaling decisions")
    parser.add_argument("--priority", type=int, default=None,
                        help="peering priority; the highest live operator of the release works, the others stand by "
                             "(default: random, so two replicas never tie)")
    parser.add_argument("--standalone", action="store_true",
                        help="no peering: for a single operator without the release's peering record "
                             "(k25-operator-<release>)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from operators.config import OperatorConfig
    from operators.runtime import run_operator  # kopf loads only for this command

    if not args.interval > 0:
        raise SystemExit("k25 operator: --interval must be positive")
    try:
        config = OperatorConfig(release=args.release, redis_url=args.redis_url, redis_secret=args.redis_secret,
                                curve_secret=args.curve_secret, redis_ca_secret=args.redis_ca_secret,
                                interval_s=args.interval,
                                allowed_images=tuple(args.allowed_images))
    except ValueError as error:
        raise SystemExit(f"k25 operator: {error}") from error
    run_operator(config, namespaces=args.namespace, priority=args.priority, standalone=args.standalone)
    return 0
