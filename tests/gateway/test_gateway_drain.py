"""A stopping gateway (SIGTERM: a scale-down, a rollout) closes its port at once, so that it turns
not-ready and gets no new connections, and lets the answers in flight finish within its drain
timeout (`--drain-timeout-s`, by default the request timeout), not a fixed few seconds."""

import http.client
import json
import signal
import socket
import time

import pytest

from tests.helpers.engine_process import start_engine
from tests.helpers.gateway_process import http_json, start_gateway
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

PATIENCE_S = 120  # for a loaded 2-core machine; each wait ends as soon as what it waits for happens
FORMER_DRAIN_S = 5  # the fixed window uvicorn was given before: the request is held past it


@pytest.fixture(scope="module")
def stack(module_redis_url, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("gateway-drain")
    engine = start_engine(module_redis_url, str(folder / "engine.log"), "--model", "tiny-random", "--chunk-size", "64")
    gateway = None
    try:
        gateway = start_gateway(module_redis_url, str(folder / "gateway.log"))
        yield engine, gateway
    finally:
        for process in (gateway, engine):
            if process is not None:
                process.stop(signal.SIGKILL)


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return False
    except OSError:
        return True


def test_a_request_in_flight_outlives_the_stop_and_new_connections_are_refused(stack):
    """The request in flight is one whose body is still arriving: it is held open for as long as the
    test likes, with no engine trick (a stopped engine would be seen as lost)."""
    _, gateway = stack
    assert http_json(f"{gateway.url}/readyz")[0] == 200
    body = json.dumps({"model": "tiny-random", "prompt": "drain", "max_tokens": 4, "temperature": 0}).encode()
    client = socket.create_connection(("127.0.0.1", gateway.port), timeout=PATIENCE_S)
    client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: k25\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
    gateway.process.send_signal(signal.SIGTERM)

    deadline = time.monotonic() + PATIENCE_S
    while not refuses_connections(gateway.port):  # its port closes: probes fail, new clients go elsewhere
        assert time.monotonic() < deadline and gateway.process.poll() is None
        time.sleep(0.05)
    time.sleep(FORMER_DRAIN_S + 1)
    assert gateway.process.poll() is None, "the gateway cut its requests in flight instead of draining"

    client.sendall(body[10:])
    response = http.client.HTTPResponse(client)
    response.begin()
    answer = json.loads(response.read())
    client.close()
    assert response.status == 200 and answer["usage"]["completion_tokens"] >= 1
    assert answer["choices"][0]["finish_reason"] in ("length", "stop")
    # uvicorn ends by raising the signal it stopped for again, once it has drained
    assert gateway.process.wait(timeout=PATIENCE_S) in (0, -signal.SIGTERM)


def test_a_negative_drain_timeout_is_refused(module_redis_url, tmp_path):  # noqa: F811
    with pytest.raises(RuntimeError, match="--drain-timeout-s must be at least 0"):
        start_gateway(module_redis_url, str(tmp_path / "gateway.log"), "--drain-timeout-s", "-1", timeout_s=30)
