"""`k25 rollout FILE`: run an AdapterRollout's canary on one machine, without Kubernetes.

FILE is an AdapterRollout manifest (as `kubectl apply` takes it); its spec is stepped
against the given Redis exactly as the operator steps it in a cluster, each change is
printed, and the command ends when the canary is promoted or rolled back (exit 0 or 3).
Use it with `k25 up --adapter-root DIR`: the engines load what the rollout names and the
gateway splits users by it.
"""

import sys
import time
from k25.commands.redis_flags import add_redis_flags


def register(subparsers) -> None:
    p = subparsers.add_parser("rollout", help="run an AdapterRollout canary against a local stack", description=__doc__)
    p.add_argument("file", metavar="FILE", help="an AdapterRollout manifest (YAML)")
    add_redis_flags(p, "the stack's Redis (k25 up prints it)")
    p.add_argument("--tick-s", type=float, default=1.0, help="seconds between steps (default 1)")
    p.set_defaults(handler=run)


def run(args) -> int:
    import redis
    import yaml

    from common.rollout_keys import PROMOTED, ROLLED_BACK
    from operators.rollout_spec import RolloutSpecError, parse_rollout_spec
    from operators.rollout_step import describe_state, run_step

    try:
        with open(args.file) as f:
            manifest = yaml.safe_load(f)
        if not isinstance(manifest, dict) or manifest.get("kind") != "AdapterRollout":
            raise RolloutSpecError(f"{args.file} is not an AdapterRollout manifest")
        rollout = parse_rollout_spec(manifest.get("spec") or {})
    except (OSError, yaml.YAMLError, RolloutSpecError) as exc:
        print(f"k25 rollout: {exc}", file=sys.stderr)
        return 2
    client = redis.Redis.from_url(args.redis_url, socket_connect_timeout=1, socket_timeout=2)
    status, message = None, None
    while True:
        try:
            outcome = run_step(client, args.release, rollout, status, time.time())
        except redis.RedisError as exc:
            print(f"k25 rollout: Redis unreachable ({exc}); retrying", file=sys.stderr, flush=True)
            time.sleep(args.tick_s)
            continue
        status = outcome.result.status
        if outcome.generation is not None:
            _say(f"{rollout.adapter}: {describe_state(outcome.generation, outcome.result.state)}")
        if status.message != message:
            message = status.message
            _say(f"{rollout.adapter}: {message}")
        if status.phase in (PROMOTED, ROLLED_BACK):
            return 0 if status.phase == PROMOTED else 3
        time.sleep(args.tick_s)


def _say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)
