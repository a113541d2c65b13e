"""`k25 up`: the whole stack as local processes on this machine.

A Redis (its own redis-server on a free port unless --redis-url is given), engine
processes for each pool, and the gateway on --host/--port. It prints where each part
listens, and stops every child on Ctrl-C, on SIGTERM, or as soon as one of them dies.
"""

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request

from k25.model_source import DEFAULT_MODEL

STARTUP_TIMEOUT_S = 300


def _pool(spec: str) -> tuple[str, int]:
    name, sep, size = spec.partition("=")
    if not sep or not name or not size.isdigit() or int(size) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=CHUNK_SIZE (e.g. short=256), got {spec!r}")
    return name, int(size)


def register(subparsers) -> None:
    p = subparsers.add_parser("up", help="run the whole stack locally (Redis, engines, gateway)", description=__doc__)
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"smollm2-135m, tiny-random, a .gguf file or a folder (default {DEFAULT_MODEL})")
    p.add_argument("--engines", type=int, default=1, help="engine processes per pool (default 1)")
    p.add_argument("--pool", dest="pools", type=_pool, action="append", metavar="NAME=CHUNK_SIZE",
                   help="an engine pool and its chunk_size; repeatable (default default=256)")
    p.add_argument("--host", default="127.0.0.1", help="gateway address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="gateway port (default 8000)")
    p.add_argument("--redis-url", default=None, help="use this Redis instead of starting one")
    p.add_argument("--release", default="k25", help="prefix of every Redis key (default k25)")
    p.add_argument("--log-dir", default=None, help="where each process writes its log (default: a new temporary folder)")
    p.add_argument("--api-keys-file", default=None, help="passed to the gateway (see `k25 api-key`)")
    p.set_defaults(handler=run)


def run(args) -> int:
    import redis

    from k25.local_stack import ProcessGroup, free_port
    from k25.redis_keys import live_engines

    if args.engines < 1:
        raise SystemExit("k25 up: --engines must be at least 1")
    pools = args.pools or [("default", 256)]
    if len({name for name, _ in pools}) != len(pools):
        raise SystemExit("k25 up: each --pool needs its own name")
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="k25-up-")
    os.makedirs(log_dir, exist_ok=True)
    group = ProcessGroup(log_dir)
    stop_requested = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop_requested.append(True))
    k25 = [sys.executable, "-m", "k25.cli"]

    def say(text: str) -> None:
        print(f"k25 up: {text}", flush=True)

    def wait_for(what: str, ready, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = group.first_exited()
            if dead is not None:
                raise _StackFailed(f"{dead.name} exited with code {dead.process.returncode} while starting:\n{dead.log_tail()}")
            if stop_requested:
                raise _StackFailed("interrupted")
            if time.monotonic() > deadline:
                raise _StackFailed(f"{what} not ready after {timeout_s:.0f} s (logs in {log_dir})")
            time.sleep(0.2)

    try:
        redis_url = args.redis_url
        if redis_url is None:
            server = shutil.which("redis-server")
            if server is None:
                raise _StackFailed("no redis-server on PATH: install Redis (e.g. `apt install redis-server`) "
                                   "or pass --redis-url redis://HOST:PORT/0")
            port = free_port()
            group.spawn("redis", [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            redis_url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(redis_url, socket_connect_timeout=0.5, socket_timeout=1.0)
        wait_for("Redis", lambda: _pings(client), timeout_s=20)
        say(f"{'redis':<18} {redis_url}")

        expected = 0
        for pool, chunk_size in pools:
            for index in range(args.engines):
                name = f"engine-{pool}-{index}"
                group.spawn(name, [*k25, "engine", "--model", args.model, "--pool", pool, "--chunk-size", str(chunk_size),
                                   "--zmq-port", "0", "--metrics-port", str(free_port()), "--redis-url", redis_url,
                                   "--release", args.release, "--engine-id", name])
                expected += 1
        say(f"starting {expected} engine(s) with {args.model} (logs in {log_dir}) ...")
        wait_for("the engines", lambda: len(_engines(client, args.release, live_engines)) >= expected)
        for engine_id, entry in sorted(_engines(client, args.release, live_engines).items()):
            say(f"{engine_id:<18} pool {entry['pool']}, chunk_size {entry['chunk_size']}, tcp://{entry['address']}")

        gateway_argv = [*k25, "gateway", "--host", args.host, "--port", str(args.port), "--model", args.model,
                        "--redis-url", redis_url, "--release", args.release]
        if args.api_keys_file:
            gateway_argv += ["--api-keys-file", args.api_keys_file]
        group.spawn("gateway", gateway_argv)
        base = f"http://{args.host}:{args.port}"
        wait_for("the gateway", lambda: _http_ok(f"{base}/readyz"), timeout_s=60)
        say(f"{'gateway':<18} {base}  (OpenAI base URL {base}/v1, metrics {base}/metrics)")
        say("ready; Ctrl-C stops everything")

        while not stop_requested:
            dead = group.first_exited()
            if dead is not None:
                raise _StackFailed(f"{dead.name} exited with code {dead.process.returncode}; stopping the stack:\n{dead.log_tail()}")
            time.sleep(0.2)
        say("stopping ...")
        return 0
    except _StackFailed as exc:
        print(f"k25 up: {exc}", file=sys.stderr, flush=True)
        return 0 if str(exc) == "interrupted" else 1
    finally:
        group.stop_all()
        say("stopped")


class _StackFailed(Exception):
    pass


def _pings(client) -> bool:
    import redis

    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def _engines(client, release: str, live_engines) -> dict:
    import redis

    try:
        return live_engines(client, release)
    except redis.RedisError:
        return {}


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False
