"""Ctrl-C of `k25 up` stops its stack in order: the engines first, each finishing the
requests it is running (its drain), while the gateway still streams their answers; then the
gateway and the chunker; then Redis. Nothing is left behind."""

import json
import re
import signal

import httpx
import pytest

from tests.helpers.gateway_process import children_of, start_stack
from tests.helpers.up_stack import alive, process_group

pytestmark = pytest.mark.slow

# still decoding (a second or more on a CPU) when Ctrl-C comes right after its first token
LONG_ANSWER_TOKENS = 400
# however busy the machine, the engine may take this long to finish it
DRAIN_TIMEOUT_S = 300


def test_ctrl_c_lets_a_running_request_finish_then_stops_engines_gateway_and_redis_in_turn(tmp_path):
    stack = start_stack(str(tmp_path / "up.log"), "--model", "tiny-random", "--log-dir", str(tmp_path),
                        "--drain-timeout-s", str(DRAIN_TIMEOUT_S))
    children = children_of(stack.process.pid)
    # a Ctrl-C at the terminal goes to the foreground process group: only k25 up is in it
    assert all(process_group(pid) != process_group(stack.process.pid) for pid in children)
    body = {"model": "tiny-random", "prompt": "Hi", "max_tokens": LONG_ANSWER_TOKENS, "temperature": 0, "stream": True}
    events = []
    try:
        with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=DRAIN_TIMEOUT_S) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line.removeprefix("data: "))
                if len(events) == 1:
                    stack.process.send_signal(signal.SIGINT)
        assert stack.process.wait(timeout=DRAIN_TIMEOUT_S + 60) == 0
    finally:
        stack.stop(signal.SIGKILL)
    assert events[-1] == "[DONE]", f"the answer was cut: {events[-2:]}"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    stopped = re.findall(r"^k25 up: (\S+)\s+stopped$", stack.log(), re.M)
    assert stopped.index("engine-default-0") < stopped.index("gateway") < stopped.index("redis")
    assert stopped.index("chunker") < stopped.index("redis")
    assert not [argv for pid, argv in children.items() if alive(pid)], "parts left behind"
