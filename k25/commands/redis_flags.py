"""--redis-url and --release, as every part that talks to the release's Redis takes them.

Their defaults come from the environment, which is how a pod receives them: a Redis URL
can carry a password, and arguments show in `ps` and in the pod spec, so the chart hands
the URL over as K25_REDIS_URL from a Secret."""

import argparse
import os

LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"


def add_redis_flags(parser: argparse.ArgumentParser, redis_help: str, release_help: str = "prefix of every Redis key") -> None:
    parser.add_argument("--redis-url", default=os.environ.get("K25_REDIS_URL", LOCAL_REDIS_URL),
                        help=f"{redis_help} (default: $K25_REDIS_URL or {LOCAL_REDIS_URL})")
    parser.add_argument("--release", default=os.environ.get("K25_RELEASE", "k25"),
                        help=f"{release_help} (default: $K25_RELEASE or k25)")
