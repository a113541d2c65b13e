"""`k25 up --autoscale`: the operator's policy on local engine processes. Load above the
target per engine adds an engine that then takes traffic; when the load stops, the pool
shrinks back after the scale-down window, and the engine it stopped stays stopped while
one that dies is started again."""

import os
import re
import signal
import threading
import time
import urllib.request

import pytest

from tests.helpers.engine_process import wait_until
from tests.helpers.gateway_process import http_json, start_stack
from tests.helpers.up_stack import incarnation, part_pid, redis_client

pytestmark = pytest.mark.slow

TARGET_QPS = 2
# closed-loop senders: one alone fell under the target when the machine was busy (each request slower)
LOAD_WORKERS = 4


@pytest.fixture
def stack(tmp_path):
    service = start_stack(
        str(tmp_path / "up.log"), "--model", "tiny-random", "--log-dir", str(tmp_path), "--autoscale",
        "--target-qps-per-replica", str(TARGET_QPS), "--max-engines", "2", "--scale-down-window-s", "4",
        "--autoscale-interval-s", "1", "--qps-window-s", "3",
    )
    yield service
    service.stop(signal.SIGINT)


def engines_in(stack) -> dict[str, str]:
    """engine name -> metrics URL, as `k25 up` announced them."""
    return dict(re.findall(r"k25 up: (engine-\S+)\s+pool .*metrics (http://\S+)$", stack.log(), re.M))


def requests_served(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(r"^k25_engine_requests_finished_total\{[^}]*\} (\S+)$", text, re.M))


def test_load_adds_an_engine_that_serves_the_pool_shrinks_after_and_only_a_dead_engine_starts_again(stack):
    stop = threading.Event()
    statuses = []

    def load():  # each worker up to 3x the target of one engine; together well above it on a slow, busy machine too
        while not stop.is_set():
            statuses.append(http_json(f"{stack.url}/v1/completions",
                                      {"model": "tiny-random", "prompt": "Hi", "max_tokens": 2})[0])
            time.sleep(1 / (3 * TARGET_QPS))

    workers = [threading.Thread(target=load) for _ in range(LOAD_WORKERS)]
    for worker in workers:
        worker.start()
    try:
        wait_until(lambda: len(engines_in(stack)) == 2, timeout_s=90, interval_s=0.5, what="a second engine")
        new_engine = next(url for name, url in engines_in(stack).items() if name != "engine-default-0")
        wait_until(lambda: requests_served(new_engine) > 0, timeout_s=30, what="the new engine serving requests")
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=30)
    assert set(statuses) == {200}
    wait_until(lambda: re.search(r"engine-default-1\s+stopped", stack.log()),
               timeout_s=60, interval_s=0.5, what="the pool shrinking back to one engine")
    assert "ScaledUp" in stack.log() and "ScaledDown" in stack.log()
    wait_until(lambda: http_json(f"{stack.url}/readyz")[2]["engines"] == 1, what="the gateway seeing one engine")
    # a death is not a decision: engine-default-0 starts again, the one the policy stopped does not
    client = redis_client(stack)
    first = incarnation(client, "engine-default-0")
    os.kill(part_pid(stack, "engine-default-0"), signal.SIGKILL)
    wait_until(lambda: incarnation(client, "engine-default-0") not in (None, first), timeout_s=120, interval_s=0.2,
               what="engine-default-0 registering again")
    assert not re.search(r"engine-default-1\s+(exited|started again)", stack.log())
    assert part_pid(stack, "engine-default-1") is None and incarnation(client, "engine-default-1") is None
