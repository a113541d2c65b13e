"""Looking into a running `k25 up` from a test: its parts' process ids, its Redis, and what
it printed about its engines."""

import re
import signal

import redis

from common.redis_keys import live_engines
from tests.helpers.gateway_process import ServiceProcess, children_of, start_stack

UP_RELEASE = "k25"  # `k25 up`'s default --release


def part_pid(stack: ServiceProcess, part: str) -> int | None:
    """The process id of one part of the stack (an engine's name, "gateway", "chunker" or
    "redis"), or None while it is not running."""
    needle = {"gateway": " gateway ", "chunker": " chunker ", "redis": "redis-server"}.get(part, f" --engine-id {part} ")
    return next((pid for pid, argv in children_of(stack.process.pid).items() if needle in f"{argv} "), None)


def redis_client(stack: ServiceProcess) -> redis.Redis:
    url = re.search(r"k25 up: redis\s+(redis://\S+)", stack.log()).group(1)
    return redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)


def incarnation(client: redis.Redis, engine: str) -> str | None:
    """The incarnation the engine registered with, or None while it is not registered."""
    try:
        return (live_engines(client, UP_RELEASE).get(engine) or {}).get("incarnation")
    except redis.RedisError:
        return None


def announced(stack: ServiceProcess, engine: str) -> list[dict[str, str]]:
    """Every registration of `engine` that `k25 up` printed: its ZMQ address, health and metrics URLs."""
    pattern = rf"k25 up: {re.escape(engine)}\s+pool .*, tcp://(\S+), health (\S+), metrics (\S+)$"
    return [dict(address=a, health=h, metrics=m) for a, h, m in re.findall(pattern, stack.log(), re.M)]


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name: state, parent, process group, ..."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """The process runs (a zombie does not count)."""
    try:
        return _stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def process_group(pid: int) -> int:
    return int(_stat_fields(pid)[2])


def two_engine_stack(tmp_path_factory, name: str, *flags: str):
    """A module fixture's body: `k25 up --model tiny-random --engines 2 FLAGS`, stopped with Ctrl-C
    after; its log folder holds up.log and each part's log."""
    folder = tmp_path_factory.mktemp(name)
    service = start_stack(str(folder / "up.log"), "--model", "tiny-random", "--engines", "2", "--log-dir", str(folder), *flags)
    yield service
    service.stop(signal.SIGINT)
