"""`k25 up` keeps its stack up as a cluster keeps its pods: a part that dies is started again
on the same addresses while the rest keeps serving, and a killed engine comes back as a new
registration (a new incarnation) that takes traffic."""

import os
import re
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from common.redis_keys import live_engines
from common.zmq_curve import make_client, new_secret_key
from engine.hardware.cpu_threads import default_cpu_threads, omp_wait_env, threads_per_engine
from tests.helpers.engine_process import wait_until
from tests.helpers.gateway_process import children_of, http_json
from tests.helpers.up_stack import UP_RELEASE, announced, incarnation, part_pid, redis_client, two_engine_stack

pytestmark = pytest.mark.slow

ENGINES = ("engine-default-0", "engine-default-1")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from two_engine_stack(tmp_path_factory, "supervision")


def complete(stack) -> int:
    return http_json(f"{stack.url}/v1/completions", {"model": "tiny-random", "prompt": "Hi", "max_tokens": 4})[0]


def requests_finished(metrics_url: str) -> float:
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    return sum(float(v) for v in re.findall(r"^k25_engine_requests_finished_total\{[^}]*\} (\S+)$", text, re.M))


def serves_everything(stack) -> bool:
    """Both engines behind the gateway, Redis answering, the chunker and an engine serving."""
    try:
        ready = http_json(f"{stack.url}/readyz", timeout_s=5)
        chunks = http_json(f"{stack.url}/v1/chunks", {"text": "Article 1. Terms.\n\nArticle 2. Fees.", "chunk_size": 256},
                           timeout_s=10)
        return (ready[0] == 200 and ready[2]["engines"] == 2 and ready[2]["redis"] == "ok"
                and chunks[0] == 200 and complete(stack) == 200)
    except (OSError, urllib.error.URLError):
        return False


def restarts(stack, part: str) -> int:
    return len(re.findall(rf"^k25 up: {part}\s+started again", stack.log(), re.M))


def test_the_engines_share_the_machines_cpus(stack):
    """Two engines on one machine, each with a thread a core, would wait on each other at every
    barrier: each gets an equal share of the CPUs this process may use, and computes on it."""
    share = threads_per_engine(default_cpu_threads(), len(ENGINES))
    for engine in ENGINES:
        assert f" --cpu-threads {share} " in children_of(stack.process.pid)[part_pid(stack, engine)] + " "
        log = (Path(stack.log_path).parent / f"{engine}.log").read_text()  # beside up.log
        assert f"{share} CPU threads (--cpu-threads)" in log
        spin = {**os.environ, **omp_wait_env(os.environ)}.get("GOMP_SPINCOUNT", "unset")
        assert f"OpenMP waits: GOMP_SPINCOUNT={spin} " in log


def test_a_killed_engine_starts_again_while_the_other_serves(stack):
    client = redis_client(stack)
    first = incarnation(client, "engine-default-0")
    pid = part_pid(stack, "engine-default-0")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: re.search(r"engine-default-0\s+exited with signal SIGKILL after \d+ s; starting it again", stack.log()),
               timeout_s=30, what="k25 up noticing the engine's death")
    assert [complete(stack) for _ in range(4)] == [200] * 4, "the other engine did not serve meanwhile"
    wait_until(lambda: incarnation(client, "engine-default-0") not in (None, first), timeout_s=120, interval_s=0.2,
               what="a new engine-default-0 registering")
    assert part_pid(stack, "engine-default-0") not in (None, pid)
    wait_until(lambda: len(announced(stack, "engine-default-0")) == 2, timeout_s=30, what="k25 up printing it again")
    before, after = announced(stack, "engine-default-0")
    assert after["health"] == before["health"] and after["metrics"] == before["metrics"]
    assert urllib.request.urlopen(after["health"], timeout=5).status == 200
    wait_until(lambda: complete(stack) == 200 and requests_finished(after["metrics"]) > 0, timeout_s=60, interval_s=0.1,
               what="the engine that came back serving requests")


@pytest.mark.parametrize("part", ["gateway", "chunker", "redis"])
def test_a_part_that_dies_is_started_again_on_the_same_address(stack, part):
    wait_until(lambda: serves_everything(stack), timeout_s=120, interval_s=0.5, what="the whole stack serving")
    restarted = restarts(stack, part)
    engine_restarts = [restarts(stack, engine) for engine in ENGINES]
    os.kill(part_pid(stack, part), signal.SIGKILL)
    wait_until(lambda: restarts(stack, part) == restarted + 1, timeout_s=60, what=f"k25 up starting the {part} again")
    wait_until(lambda: serves_everything(stack), timeout_s=120, interval_s=0.5, what=f"the stack serving after the {part} came back")
    # no engine had to start again: they outlived the lost part (and registered again in a new, empty Redis)
    assert [restarts(stack, engine) for engine in ENGINES] == engine_restarts


def test_an_engine_that_dies_while_redis_hangs_is_left_to_expire_and_starts_again(stack):
    wait_until(lambda: serves_everything(stack), timeout_s=120, interval_s=0.5, what="the whole stack serving")
    client = redis_client(stack)
    first = incarnation(client, "engine-default-1")
    redis_pid = part_pid(stack, "redis")
    os.kill(redis_pid, signal.SIGSTOP)  # running, but answering nothing
    try:
        os.kill(part_pid(stack, "engine-default-1"), signal.SIGKILL)
        wait_until(lambda: re.search(r"engine-default-1\s+could not be removed from the registry", stack.log()),
                   timeout_s=60, what="k25 up failing to unregister the dead engine")
    finally:
        os.kill(redis_pid, signal.SIGCONT)
    wait_until(lambda: incarnation(client, "engine-default-1") not in (None, first), timeout_s=120, interval_s=0.2,
               what="a new engine-default-1 registering")
    wait_until(lambda: serves_everything(stack), timeout_s=120, interval_s=0.5, what="the whole stack serving again")


def test_an_engine_admits_only_holders_of_the_stacks_curve_key(stack):
    """The gateway serves (it holds the key `k25 up` made); a process on the same machine
    without it fails the handshake, as the socket's monitor shows, and gets nothing."""
    wait_until(lambda: serves_everything(stack), timeout_s=120, interval_s=0.5, what="the whole stack serving")
    # from the registry, not k25 up's output: an engine started again listens on a new port,
    # which k25 up prints only once it has seen the new registration
    address = live_engines(redis_client(stack), UP_RELEASE)["engine-default-1"]["address"]
    context = zmq.Context()
    try:
        intruder = context.socket(zmq.DEALER)
        intruder.linger = 0
        make_client(intruder, new_secret_key().encode())
        monitor = intruder.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                              | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                              | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        intruder.connect(f"tcp://{address}")
        intruder.send(b"not even protobuf")
        assert monitor.poll(30_000), "no handshake outcome within 30 s"
        assert recv_monitor_message(monitor)["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert intruder.poll(0) == 0
    finally:
        context.destroy(linger=0)
