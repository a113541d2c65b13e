"""`k25 secrets ensure`: create the release's generated Secrets in the cluster when they do not
exist yet, and keep them when they do (the chart's hook Job with `generatedSecrets: job`, so that
`helm template` under Argo CD or Flux renders the same manifests every time).
`k25 secrets rotate-curve STEP`: take one step of a CURVE key rotation in the transport Secret
(operators/curve_rotation.py); roll every pod after each."""

import functools
import sys

from operators.curve_rotation import STEPS


def register(subparsers) -> None:
    parser = subparsers.add_parser("secrets", help="the release's generated Secrets: make them if absent; rotate the CURVE key",
                                   description=__doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    ensure = actions.add_parser("ensure", help="create each named Secret that does not exist; keep the others (a "
                                               "Redis Secret's URL follows --redis-ca, its password stays)")
    ensure.add_argument("--namespace", required=True, help="where the Secrets live (the release's namespace)")
    ensure.add_argument("--redis-secret", metavar="NAME",
                        help="a Secret with a new Redis password (redis-password) and the URL of REDIS_HOST with it "
                             "(redis-url)")
    ensure.add_argument("--redis-user-secret", action="append", default=[], metavar="USER=NAME",
                        help="a Secret with a new password for the Redis user USER and the URL of REDIS_HOST as that user "
                             "(repeatable: one per part)")
    ensure.add_argument("--redis-host", metavar="HOST", help="the chart's Redis Service, for the URLs")
    ensure.add_argument("--redis-ca", metavar="FILE",
                        help="Redis speaks TLS: the URLs are rediss:// and check its certificate against this CA file")
    ensure.add_argument("--transport-secret", metavar="NAME", help="a Secret with a new CURVE key (curve-secret-key)")
    ensure.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="a label of each Secret made")
    ensure.set_defaults(handler=run_ensure)
    rotate = actions.add_parser("rotate-curve", help="take one step of a CURVE key rotation in the transport Secret",
                                description="add-next: add a new key beside the current one; promote: make it "
                                            "current, keeping the old one admitted; remove-old: drop the old one. "
                                            "Roll every pod (gateway, chunker, engines) after each step, and take "
                                            "the next only once the roll has finished.")
    rotate.add_argument("step", choices=STEPS)
    rotate.add_argument("--namespace", required=True, help="the release's namespace")
    rotate.add_argument("--transport-secret", required=True, metavar="NAME",
                        help="the Secret with the key (the chart's <fullname>-transport, or transport.curve.existingSecret)")
    rotate.set_defaults(handler=run_rotate_curve)


def run_ensure(args) -> int:
    import kubernetes

    from operators.generated_secrets import (
        SecretError,
        ensure_secret,
        redis_secret_data,
        refresh_redis_url,
        transport_secret_data,
    )
    from operators.kube import load_client_configuration

    if (args.redis_secret or args.redis_user_secret) and not args.redis_host:
        print("k25 secrets ensure: --redis-secret and --redis-user-secret need --redis-host (the URL names it)",
              file=sys.stderr)
        return 2
    users = [entry.partition("=")[::2] for entry in args.redis_user_secret]
    if not all(user and name for user, name in users):
        print("k25 secrets ensure: --redis-user-secret takes USER=NAME", file=sys.stderr)
        return 2
    labels = dict(label.partition("=")[::2] for label in args.label)
    # (name, what it is made of, the Redis user whose URL it holds; None: not a Redis Secret)
    wanted = [(args.redis_secret, functools.partial(redis_secret_data, args.redis_host, "", args.redis_ca), ""),
              (args.transport_secret, transport_secret_data, None)]
    wanted += [(name, functools.partial(redis_secret_data, args.redis_host, user, args.redis_ca), user)
               for user, name in users]
    with kubernetes.client.ApiClient(load_client_configuration()) as client:
        core = kubernetes.client.CoreV1Api(client)
        for name, make, user in (entry for entry in wanted if entry[0]):
            try:
                made = ensure_secret(core, args.namespace, name, make, labels)
            except SecretError as error:
                print(f"k25 secrets ensure: {error}", file=sys.stderr)
                return 1
            # a kept Redis Secret keeps its password; its URL follows redis.tls
            moved = not made and user is not None and refresh_redis_url(core, args.namespace, name, args.redis_host,
                                                                         user, args.redis_ca)
            done = "created" if made else "kept, its URL pointed at how Redis is reached now" if moved else "kept as it was"
            print(f"k25 secrets ensure: {args.namespace}/{name} {done}")
    return 0


def run_rotate_curve(args) -> int:
    import kubernetes

    from operators.curve_rotation import RotationError
    from operators.generated_secrets import rotate_transport_secret
    from operators.kube import load_client_configuration

    with kubernetes.client.ApiClient(load_client_configuration()) as client:
        try:
            rotate_transport_secret(kubernetes.client.CoreV1Api(client), args.namespace, args.transport_secret, args.step)
        except RotationError as error:
            print(f"k25 secrets rotate-curve: {args.namespace}/{args.transport_secret}: {error}", file=sys.stderr)
            return 1
    print(f"k25 secrets rotate-curve: {args.namespace}/{args.transport_secret}: {args.step} done; now roll every pod "
          "that reads the key (change transport.curve.rotation and upgrade, or restart them)")
    return 0
