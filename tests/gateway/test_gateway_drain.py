"""A stopping gateway (SIGTERM: a scale-down, a rollout) closes its port at once, so that it turns
not-ready and gets no new connections, and lets the answers in flight finish within its drain
timeout (`--drain-timeout-s`, by default the request timeout), not a fixed few seconds."""

import http.client
import json
import re
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from tests.helpers.engine_process import start_engine, wait_until
from tests.helpers.gateway_process import http_json, start_gateway
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

PATIENCE_S = 120  # for a loaded 2-core machine; each wait ends as soon as what it waits for happens
FORMER_DRAIN_S = 5  # the fixed window uvicorn was given before: the request is held past it
BODY = json.dumps({"model": "tiny-random", "prompt": "drain", "max_tokens": 4, "temperature": 0}).encode()


@pytest.fixture(scope="module")
def engine(module_redis_url, tmp_path_factory):  # noqa: F811
    process = start_engine(module_redis_url, str(tmp_path_factory.mktemp("gateway-drain") / "engine.log"),
                           "--model", "tiny-random", "--chunk-size", "64")
    yield process
    process.stop(signal.SIGKILL)


@pytest.fixture
def gateway(module_redis_url, engine, tmp_path):  # noqa: F811
    """A gateway of its own per test: each test stops it."""
    process = start_gateway(module_redis_url, str(tmp_path / "gateway.log"))
    yield process
    process.stop(signal.SIGKILL)


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return False
    except OSError:
        return True


def start_request_in_flight(gateway) -> socket.socket:
    """A completion whose body is still arriving: in flight for as long as the test likes, with no
    engine trick (a stopped engine would be seen as lost). `finish_request` sends the rest.
    Returns once the gateway reads its body: past the check that refuses what arrives after a
    stop (a stop sent before the gateway had parsed its headers would rightly refuse it)."""
    client = socket.create_connection(("127.0.0.1", gateway.port), timeout=PATIENCE_S)
    client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: k25\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY[:10])
    wait_until(lambda: body_bytes_in_flight(gateway) >= len(BODY), timeout_s=PATIENCE_S, what="the body being read")
    return client


def body_bytes_in_flight(gateway) -> float:
    metrics = urllib.request.urlopen(f"{gateway.url}/metrics", timeout=PATIENCE_S).read().decode()
    return float(re.search(r"^k25_gateway_body_bytes_in_flight (\S+)$", metrics, re.M).group(1))


def finish_request(client: socket.socket) -> http.client.HTTPResponse:
    client.sendall(BODY[10:])
    response = http.client.HTTPResponse(client)
    response.begin()
    return response


def stop_and_wait_for_the_port_to_close(gateway) -> None:
    gateway.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + PATIENCE_S
    while not refuses_connections(gateway.port):  # its port closes: probes fail, new clients go elsewhere
        assert time.monotonic() < deadline and gateway.process.poll() is None
        time.sleep(0.05)


def assert_answered(response: http.client.HTTPResponse) -> None:
    answer = json.loads(response.read())
    assert response.status == 200 and answer["usage"]["completion_tokens"] >= 1
    assert answer["choices"][0]["finish_reason"] in ("length", "stop")


def test_a_request_in_flight_outlives_the_stop_and_new_connections_are_refused(gateway):
    assert http_json(f"{gateway.url}/readyz")[0] == 200
    client = start_request_in_flight(gateway)
    stop_and_wait_for_the_port_to_close(gateway)
    # past the fixed window it had before, still running: an exit here would have cut the request
    with pytest.raises(subprocess.TimeoutExpired):
        gateway.process.wait(timeout=FORMER_DRAIN_S + 1)

    response = finish_request(client)
    assert_answered(response)
    client.close()
    # uvicorn ends by raising the signal it stopped for again, once it has drained
    assert gateway.process.wait(timeout=PATIENCE_S) in (0, -signal.SIGTERM)


def test_a_request_on_a_kept_alive_connection_of_a_stopping_gateway_is_refused_with_503_not_reset(gateway):
    """uvicorn closed idle keep-alive connections at the stop, and busy ones when their answer
    ended, unannounced: a client that had just sent its next request on one read a reset. Now it
    is answered 503 `shutting_down` with `Connection: close` (OpenAI's clients retry a 503, on a
    new connection, which another replica takes), while the request in flight still finishes and
    is told that its connection closes."""
    kept_alive = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=PATIENCE_S)
    kept_alive.request("POST", "/v1/completions", BODY, {"Content-Type": "application/json"})
    assert_answered(kept_alive.getresponse())  # read to the end: the connection is idle, kept alive
    in_flight = start_request_in_flight(gateway)  # keeps the gateway draining
    stop_and_wait_for_the_port_to_close(gateway)

    kept_alive.request("POST", "/v1/completions", BODY, {"Content-Type": "application/json"})
    refused = kept_alive.getresponse()
    assert refused.status == 503
    assert refused.getheader("connection") == "close" and int(refused.getheader("retry-after")) >= 1
    error = json.loads(refused.read())["error"]
    assert error["code"] == "shutting_down" and error["type"] == "server_error"
    assert kept_alive.sock is None  # http.client closed its side, as told: the next request opens a new one
    kept_alive.close()

    response = finish_request(in_flight)
    assert response.getheader("connection") == "close"
    assert_answered(response)
    in_flight.close()
    assert gateway.process.wait(timeout=PATIENCE_S) in (0, -signal.SIGTERM)


def test_a_negative_drain_timeout_is_refused(module_redis_url, tmp_path):  # noqa: F811
    with pytest.raises(RuntimeError, match="--drain-timeout-s must be at least 0"):
        start_gateway(module_redis_url, str(tmp_path / "gateway.log"), "--drain-timeout-s", "-1", timeout_s=30)
