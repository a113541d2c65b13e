"""`k25 up --autoscale`: the operator's policy on local engine processes. Load above the
target per engine adds an engine that then takes traffic; when the load stops, the pool
shrinks back after the scale-down window, and the engine it stopped stays stopped while
one that dies is started again."""

import os
import re
import signal
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers.engine_process import wait_until
from tests.helpers.gateway_process import http_json, start_stack
from tests.helpers.up_stack import incarnation, part_pid, redis_client

pytestmark = pytest.mark.slow

TARGET_QPS = 1
# Open loop: requests arrive at this rate however slowly they are answered. Closed-loop
# senders' rate fell with the machine's speed, most while the new engine started on the same
# cores, and the policy released the starting engine (StartingPodsReleased), again and again.
OFFERED_QPS = 4 * TARGET_QPS
MAX_IN_FLIGHT = 32


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
    answers = []

    def complete() -> int:
        return http_json(f"{stack.url}/v1/completions", {"model": "tiny-random", "prompt": "Hi", "max_tokens": 2})[0]

    with ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT) as senders:
        def offer():
            while not stop.wait(1 / OFFERED_QPS):
                answers.append(senders.submit(complete))

        offering = threading.Thread(target=offer)
        offering.start()
        try:
            wait_until(lambda: len(engines_in(stack)) == 2, timeout_s=90, interval_s=0.5, what="a second engine")
            new_name, new_engine = next((name, url) for name, url in engines_in(stack).items() if name != "engine-default-0")
            wait_until(lambda: requests_served(new_engine) > 0, timeout_s=30, what="the new engine serving requests")
        finally:
            stop.set()
            offering.join()
    statuses = [answer.result() for answer in answers]
    assert set(statuses) == {200}
    # (the policy may also have released an engine still starting before this one; that is not the shrink)
    wait_until(lambda: "ScaledDown" in stack.log() and re.search(rf"{new_name}\s+stopped", stack.log()),
               timeout_s=60, interval_s=0.5, what="the pool shrinking back to one engine")
    wait_until(lambda: http_json(f"{stack.url}/readyz")[2]["engines"] == 1, what="the gateway seeing one engine")
    # a death is not a decision: engine-default-0 starts again, no engine the policy stopped does
    client = redis_client(stack)
    first = incarnation(client, "engine-default-0")
    os.kill(part_pid(stack, "engine-default-0"), signal.SIGKILL)
    wait_until(lambda: incarnation(client, "engine-default-0") not in (None, first), timeout_s=120, interval_s=0.2,
               what="engine-default-0 registering again")
    assert set(re.findall(r"k25 up: (engine-\S+)\s+(?:exited|started again)", stack.log())) == {"engine-default-0"}
    assert part_pid(stack, new_name) is None and incarnation(client, new_name) is None
