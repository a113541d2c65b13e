"""`k25 up`: the whole stack as local processes on this machine.

A Redis (its own redis-server on a free port unless --redis-url is given), engine
processes for each pool and the chunker (listening on 127.0.0.1 only, and admitting only
holders of the run's CURVE key: $K25_CURVE_SECRET_KEY, or one made for the run), and the
gateway on --host/--port. It prints where each part listens. Once the stack is ready, a part that
exits is started again on the same ports, after a delay that doubles while it keeps
failing (1 s up to 30 s), as a kubelet restarts a container; a part that exits while the
stack starts stops it. Ctrl-C or SIGTERM stops everything in order: the engines first
(each finishes its running requests within --drain-timeout-s), then the gateway and the
chunker, then Redis.
With --autoscale, the operator's autoscaling policy starts and stops engines from the
gateway's QPS, between --engines and --max-engines per pool; an engine it stops stays stopped.
"""

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request

from common.engine_settings import BACKENDS
from common.model_source import DEFAULT_MODEL
from common.zmq_curve import ENV as CURVE_ENV
from common.zmq_curve import new_secret_key
from engine.base.errors import EngineConfigError
from k25.commands.engine_backend import vllm_python
from k25.restart_policy import describe_exit

STARTUP_TIMEOUT_S = 300
DEFAULT_POOL = ("default", 256)  # (name, chunk_size) when no --pool is given
# what stop_all ends first: engines drain while the gateway can still stream their answers
ENGINES, FRONT, REDIS = 0, 1, 2
# beyond an engine's drain timeout, before SIGKILL: its last answers and the unregistering
DRAIN_MARGIN_S = 5.0
# from SIGTERM to SIGKILL for the gateway (it gives open responses 5 s), the chunker and Redis
STOP_GRACE_S = 10.0


def _pool(spec: str) -> tuple[str, int]:
    name, sep, size = spec.partition("=")
    if not sep or not name or not size.isdigit() or int(size) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=CHUNK_SIZE (e.g. short=256), got {spec!r}")
    return name, int(size)


def register(subparsers) -> None:
    p = subparsers.add_parser("up", help="run the whole stack locally (Redis, engines, chunker, gateway)", description=__doc__)
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"smollm2-135m, tiny-random, a .gguf file or a folder (default {DEFAULT_MODEL})")
    p.add_argument("--engines", type=int, default=1,
                   help="engine processes per pool (default 1; the minimum with --autoscale, where 0 starts each pool "
                   "empty and its first requests wake it). The machine's CPUs are shared among the most engines "
                   "that may run (--engines, or --max-engines with --autoscale, per pool): each engine's "
                   "--cpu-threads, unless --engine-flag sets it")
    p.add_argument("--pool", dest="pools", type=_pool, action="append", metavar="NAME=CHUNK_SIZE",
                   help="an engine pool and its chunk_size; repeatable (default default=256)")
    p.add_argument("--host", default="127.0.0.1", help="gateway address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="gateway port (default 8000)")
    p.add_argument("--redis-url", default=None, help="use this Redis instead of starting one")
    p.add_argument("--release", default="k25", help="prefix of every Redis key (default k25)")
    p.add_argument("--log-dir", default=None, help="where each process writes its log (default: a new temporary folder)")
    p.add_argument("--api-keys-file", default=None, help="passed to the gateway (see `k25 api-key`)")
    p.add_argument("--adapter-root", default=None, help="LoRA adapters load from folders under this one (turns adapters on)")
    p.add_argument("--max-loras", type=int, default=4, help="adapters on each engine at once, with --adapter-root (default 4)")
    p.add_argument("--drain-timeout-s", type=float, default=25.0,
                   help="on stop, how long each engine may finish its running requests before it cancels them; "
                        f"SIGKILL follows {DRAIN_MARGIN_S:.0f} s later (default 25)")
    p.add_argument("--backend", choices=BACKENDS, default="k25",
                   help="the engines' backend: k25, K25's own, or vllm, vLLM's engine behind the same wire, run by "
                   "this Python if it has vLLM, else by the checkout's .venv-vllm (`make vllm`) (default k25)")
    p.add_argument("--engine-flag", action="append", default=[], metavar="FLAG",
                   help="one more flag for every engine, e.g. --engine-flag=--max-waiting=64; repeatable")
    p.add_argument("--gateway-flag", action="append", default=[], metavar="FLAG",
                   help="one more flag for the gateway, e.g. --gateway-flag=--engine-wait-s=120; repeatable")
    scaling = p.add_argument_group("autoscaling (the operator's policy, on local engine processes)")
    scaling.add_argument("--autoscale", action="store_true", help="start and stop engines from the pool's QPS")
    scaling.add_argument("--max-engines", type=int, default=4, help="engines per pool at most (default 4)")
    scaling.add_argument("--target-qps-per-replica", type=float, default=80.0, help="QPS one engine should carry (default 80)")
    scaling.add_argument("--scale-down-window-s", type=float, default=60.0, help="scale-down stabilisation window (default 60)")
    scaling.add_argument("--autoscale-interval-s", type=float, default=2.0, help="seconds between decisions (default 2)")
    scaling.add_argument("--qps-window-s", type=int, default=5, help="QPS is the mean over this many seconds (default 5)")
    p.set_defaults(handler=run)


class _StackFailed(Exception):
    pass


class LocalStack:
    def __init__(self, args, log_dir: str, engine_python: str = sys.executable):
        from k25.local_stack import ProcessGroup

        self.args = args
        self.log_dir = log_dir
        self.group = ProcessGroup(log_dir)
        self.stop_requested = False
        self.redis_url = args.redis_url
        self.client = None
        self._engine_counter = 0
        self._reserved_ports = frozenset({args.port})  # the gateway binds it last: no other part may take it first
        self.engine_threads = 1  # run() shares the CPUs among the most engines the stack may run
        self._k25 = [sys.executable, "-m", "k25.cli"]
        self._engine_k25 = [engine_python, "-m", "k25.cli"]
        # engines and the chunker admit only the gateway of this stack (a key made for the run)
        self._transport_env = {CURVE_ENV: os.environ.get(CURVE_ENV) or new_secret_key()}

    @staticmethod
    def say(text: str) -> None:
        print(f"k25 up: {text}", flush=True)

    def wait_for(self, what: str, ready, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            self.check_children(f"while {what} started")
            if self.stop_requested:
                raise _StackFailed("interrupted")
            if time.monotonic() > deadline:
                raise _StackFailed(f"{what} not ready after {timeout_s:.0f} s (logs in {self.log_dir})")
            time.sleep(0.2)

    def check_children(self, when: str) -> None:
        dead = self.group.first_exited()
        if dead is not None:
            raise _StackFailed(f"{dead.name} exited with {describe_exit(dead.process.returncode)} {when}; "
                               f"stopping the stack. Its log ends with:\n{dead.log_tail()}")

    def start_redis(self) -> None:
        import redis

        from common.ports import free_port

        if self.redis_url is None:
            server = shutil.which("redis-server")
            if server is None:
                raise _StackFailed("no redis-server on PATH: install Redis (e.g. `apt install redis-server`) "
                                   "or pass --redis-url redis://HOST:PORT/0")
            port = free_port(self._reserved_ports)
            self.group.spawn("redis", [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                             REDIS, STOP_GRACE_S)
            self.redis_url = f"redis://127.0.0.1:{port}/0"
        self.client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=0.5, socket_timeout=1.0)
        self.wait_for("Redis", self._redis_pings, timeout_s=20)
        self.say(f"{'redis':<18} {self.redis_url}")

    def spawn_engine(self, pool: str, chunk_size: int):
        from common.ports import free_port

        name = f"engine-{pool}-{self._engine_counter}"
        self._engine_counter += 1
        metrics_port = free_port(self._reserved_ports)  # kept when the engine starts again: its health URL stays valid
        child = self.group.spawn(name, [
            *self._engine_k25, "engine", "--model", self.args.model, "--pool", pool, "--chunk-size", str(chunk_size),
            "--bind-address", "127.0.0.1", "--zmq-port", "0", "--metrics-port", str(metrics_port),
            "--drain-timeout-s", str(self.args.drain_timeout_s), "--redis-url", self.redis_url,
            "--release", self.args.release, "--engine-id", name, "--cpu-threads", str(self.engine_threads),
            "--backend", self.args.backend, *self._lora_flags(), *self.args.engine_flag,
        ], ENGINES, self.args.drain_timeout_s + DRAIN_MARGIN_S, self._transport_env)
        child.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        return child

    def _lora_flags(self) -> list[str]:
        if not self.args.adapter_root:
            return []
        return ["--adapter-root", os.path.abspath(self.args.adapter_root), "--max-loras", str(self.args.max_loras)]

    def registered(self) -> dict:
        import redis

        from common.redis_keys import live_engines

        try:
            return live_engines(self.client, self.args.release)
        except redis.RedisError:
            return {}

    def announce_registered(self, engines) -> None:
        """Print each engine whose registration is new: at first, and after each restart (a new incarnation)."""
        registered = self.registered()
        for child in engines:
            entry = registered.get(child.name)
            incarnation = (entry or {}).get("incarnation") or "unknown"
            if entry is None or incarnation == child.announced_incarnation or not child.running:
                continue
            child.announced_incarnation = incarnation
            health_url = child.metrics_url.removesuffix("/metrics") + "/healthz"
            self.say(f"{child.name:<18} pool {entry.get('pool')}, chunk_size {entry.get('chunk_size')}, "
                     f"tcp://{entry.get('address')}, health {health_url}, metrics {child.metrics_url}")

    def report(self, event) -> None:
        self.say(event.message)
        if event.what == "exited" and event.child.stop_phase == ENGINES:
            self._unregister(event.child.name)

    def _unregister(self, engine_id: str) -> None:
        """A dead engine's entry would live on until its TTL; the gateway drops it at once
        instead, as Kubernetes drops a dead pod from its Service's endpoints."""
        import redis

        from common.redis_keys import unregister_engine

        try:
            unregister_engine(self.client, self.args.release, engine_id)
        except redis.RedisError as exc:
            self.say(f"{engine_id:<18} could not be removed from the registry ({exc}); its entry expires on its own")

    def start_chunker(self) -> str:
        from common.ports import free_port

        port = free_port(self._reserved_ports)
        metrics_port = free_port(self._reserved_ports | {port})
        self.group.spawn("chunker", [*self._k25, "chunker", "--bind-address", "127.0.0.1", "--zmq-port", str(port),
                                     "--metrics-port", str(metrics_port), "--model", self.args.model],
                         FRONT, STOP_GRACE_S, self._transport_env)
        self.wait_for("the chunker", lambda: _http_ok(f"http://127.0.0.1:{metrics_port}/metrics"), timeout_s=60)
        self.say(f"{'chunker':<18} tcp://127.0.0.1:{port}, metrics http://127.0.0.1:{metrics_port}/metrics")
        return f"127.0.0.1:{port}"

    def start_gateway(self, chunker_address: str) -> str:
        args = self.args
        argv = [*self._k25, "gateway", "--host", args.host, "--port", str(args.port), "--model", args.model,
                "--redis-url", self.redis_url, "--release", args.release, "--chunker-address", chunker_address]
        for name, chunk_size in args.pools or [DEFAULT_POOL]:  # known with no engine yet: demand wakes a pool at zero
            argv += ["--pool", f"{name}={chunk_size}"]
        if args.api_keys_file:
            argv += ["--api-keys-file", args.api_keys_file]
        argv += args.gateway_flag
        self.group.spawn("gateway", argv, FRONT, STOP_GRACE_S, self._transport_env)
        base = f"http://{args.host}:{args.port}"
        self.wait_for("the gateway", lambda: _http_ok(f"{base}/readyz"), timeout_s=60)
        self.say(f"{'gateway':<18} {base}  (OpenAI base URL {base}/v1, metrics {base}/metrics)")
        return base

    def _redis_pings(self) -> bool:
        import redis

        try:
            return bool(self.client.ping())
        except redis.RedisError:
            return False


def run(args) -> int:
    pools = args.pools or [DEFAULT_POOL]
    problem = _bad_flags(args, pools)
    if problem:
        print(f"k25 up: {problem}", file=sys.stderr)
        return 2
    try:
        engine_python = vllm_python() if args.backend == "vllm" else sys.executable
    except EngineConfigError as exc:
        print(f"k25 up: {exc}", file=sys.stderr)
        return 2
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="k25-up-")
    os.makedirs(log_dir, exist_ok=True)
    stack = LocalStack(args, log_dir, engine_python)

    def request_stop(*_):
        stack.stop_requested = True

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, request_stop)
    try:
        stack.start_redis()
        local_pools = _make_pools(args, pools)
        stack.engine_threads = _engine_threads(local_pools)
        for pool in local_pools:
            pool.engines = [stack.spawn_engine(pool.name, pool.chunk_size) for _ in range(args.engines)]
        everyone = [e for pool in local_pools for e in pool.engines]
        stack.say(f"starting {len(everyone)} engine(s) with {args.model} (logs in {log_dir}) ...")
        stack.wait_for("the engines", lambda: {e.name for e in everyone} <= set(stack.registered()))
        stack.announce_registered(everyone)
        stack.start_gateway(stack.start_chunker())
        stack.say("ready; Ctrl-C stops everything")
        _supervise(stack, local_pools)
        stack.say(f"stopping: engines first (each finishes its running requests, up to {args.drain_timeout_s:.0f} s), "
                  "then the gateway and the chunker, then Redis ...")
        return 0
    except _StackFailed as exc:
        if str(exc) == "interrupted":
            return 0
        print(f"k25 up: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        stack.group.stop_all(stack.report)
        stack.say("stopped")


def _supervise(stack: LocalStack, pools) -> None:
    """Until Ctrl-C or SIGTERM: start again what exits, print engines as they register, autoscale."""
    next_announcement = next_decision = time.monotonic()
    while not stack.stop_requested:
        now = time.monotonic()
        for event in stack.group.tend(now):
            stack.report(event)
        if now >= next_announcement:
            stack.announce_registered([e for pool in pools for e in pool.engines])
            next_announcement = now + 1.0
        if stack.args.autoscale and now >= next_decision:
            for pool in pools:
                _autoscale(stack, pool)
            next_decision = now + stack.args.autoscale_interval_s
        time.sleep(0.2)


def _bad_flags(args, pools) -> str | None:
    if args.engines < 0 or (args.engines == 0 and not args.autoscale):
        return "--engines must be at least 1 (0 only with --autoscale, which starts a pool's first engine on demand)"
    if args.drain_timeout_s < 0:
        return "--drain-timeout-s must not be negative"
    if args.autoscale and args.max_engines < args.engines:
        return "--max-engines must be at least --engines"
    if len({name for name, _ in pools}) != len(pools):
        return "each --pool needs its own name"
    return None


def _make_pools(args, pools):
    from k25.local_autoscaler import LocalPool
    from operators.autoscale_policy import ScalingRules

    rules = ScalingRules(
        min_replicas=args.engines, max_replicas=args.max_engines if args.autoscale else args.engines,
        target_qps_per_replica=args.target_qps_per_replica, scale_down_window_s=args.scale_down_window_s,
    )
    return [LocalPool(name, chunk_size, rules) for name, chunk_size in pools]


def _engine_threads(pools) -> int:
    """The CPUs this process may use, shared among the most engines that may run at once: engines
    on one machine that each start a thread a core wait on each other at every barrier."""
    from engine.hardware.cpu_threads import default_cpu_threads, threads_per_engine

    return threads_per_engine(default_cpu_threads(), sum(pool.rules.max_replicas for pool in pools))


def _autoscale(stack: LocalStack, pool) -> None:
    import redis

    from k25.local_autoscaler import engines_to_stop, observe, step

    try:
        seen, ready = observe(stack.client, stack.args.release, pool, time.time(), stack.args.qps_window_s)
    except redis.RedisError as exc:
        stack.say(f"autoscale {pool.name}: cannot read Redis ({exc}); holding")
        return
    decision = step(pool, seen)
    if decision.replicas == len(pool.engines):
        return
    stack.say(f"autoscale {pool.name}: {decision.message} ({decision.reason})")
    if decision.replicas > len(pool.engines):
        pool.engines += [stack.spawn_engine(pool.name, pool.chunk_size) for _ in range(decision.replicas - len(pool.engines))]
    else:
        for engine in engines_to_stop(pool, ready, len(pool.engines) - decision.replicas):
            pool.engines.remove(engine)
            stack.group.stop(engine, time.monotonic())  # `tend` reports it once it has drained


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False
