"""Clients that send their bodies slowly or hold many large ones, against a real `k25 gateway`
(no engine is needed: every request here ends before one would be asked). A body that does not
arrive within --body-timeout-s is answered 408 and gives back what it held; while the bodies
held reach --max-body-bytes-in-flight, another request is refused with 503 before its body is
read."""

import http.client
import json
import re
import socket

import pytest

from tests.helpers.engine_process import wait_until
from tests.helpers.gateway_process import start_gateway
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow  # starts a real process

# long enough for the test to look at what a slow body holds meanwhile (one local HTTP call)
BODY_TIMEOUT_S = 10
IN_FLIGHT = 1000


@pytest.fixture(scope="module")
def gateway(module_redis_url, tmp_path_factory):  # noqa: F811
    service = start_gateway(module_redis_url, str(tmp_path_factory.mktemp("slow") / "gateway.log"),
                            "--body-timeout-s", str(BODY_TIMEOUT_S), "--max-body-bytes", "800",
                            "--max-body-bytes-in-flight", str(IN_FLIGHT), "--engine-wait-s", "0")
    yield service
    service.stop()


def post_headers(gateway, length: int, sent: bytes = b"") -> socket.socket:
    """A POST that declares `length` body bytes and sends only `sent` of them (for now)."""
    connection = socket.create_connection(("127.0.0.1", gateway.port), timeout=120)
    connection.sendall(f"POST /v1/chunks HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {length}\r\n\r\n".encode() + sent)
    return connection


def body_bytes_in_flight(gateway) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=60)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    return float(re.search(r"^k25_gateway_body_bytes_in_flight (\S+)$", text, re.M).group(1))


def answer(connection: socket.socket) -> tuple[int, dict]:
    """The response's status and JSON body (it waits for them: the socket's timeout is generous)."""
    response = http.client.HTTPResponse(connection)
    response.begin()
    status, body = response.status, json.loads(response.read())
    connection.close()
    return status, body


def test_a_body_that_never_arrives_is_answered_408_and_gives_back_its_place(gateway):
    status, body = answer(post_headers(gateway, 600, b'{"text": '))
    assert status == 408 and body["error"]["code"] == "request_timeout"
    assert f"within {BODY_TIMEOUT_S} s" in body["error"]["message"]


def test_bodies_beyond_the_bytes_in_flight_are_refused_before_they_are_read(gateway):
    slow = post_headers(gateway, 800, b'{"text": ')  # holds 800 of the 1000 bytes while it sends
    try:
        wait_until(lambda: body_bytes_in_flight(gateway) == 800, timeout_s=BODY_TIMEOUT_S, what="the slow body counted")
        status, body = answer(post_headers(gateway, 400))  # no body sent: refused on its headers alone
        assert status == 503 and body["error"]["code"] == "overloaded"
        assert "at its limit of 1000 bytes" in body["error"]["message"]
    finally:
        slow.close()  # the client leaves: what it held is given back
    wait_until(lambda: body_bytes_in_flight(gateway) == 0, timeout_s=60, what="the slow body's bytes given back")
    fits = json.dumps({"text": "Article 1. Scope."}).encode()
    status, body = answer(post_headers(gateway, len(fits), fits))
    assert body["error"]["code"] == "chunker_unavailable"  # past the body's bounds, to the route
