"""A client that stops reading its streamed answer, against a real `k25 gateway` and `k25 engine`
(the tiny model): once the gateway's writes have waited --stream-stall-s on the full connection,
the answer is cancelled at the engine, the request gives back its place (the in-flight count
falls to zero) and the gateway logs it with its request id. Before, the request held its place
until the client read again or went away."""

import json
import re
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.engine_process import start_engine, wait_until
from tests.helpers.gateway_process import start_gateway
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow  # starts real processes

STALL_S = 2


@pytest.fixture(scope="module")
def stack(module_redis_url, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("slow-readers")
    engine = start_engine(module_redis_url, str(folder / "engine.log"), "--model", "tiny-random")
    try:
        gateway = start_gateway(module_redis_url, str(folder / "gateway.log"), "--stream-stall-s", str(STALL_S))
        yield gateway, engine
        gateway.stop()
    finally:
        engine.stop()


def sample(url: str, name: str, **labels) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and labels.items() <= s.labels.items())


def stop_reading_after_the_headers(port: int, body: dict) -> tuple[socket.socket, str]:
    """POST a streamed request from a socket with a small receive buffer, read the response's
    headers and nothing more; returns the socket (still open) and the request id."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    client.connect(("127.0.0.1", port))
    payload = json.dumps(body).encode()
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
    head = b""
    while b"\r\n\r\n" not in head:
        head += client.recv(1)  # one byte at a time: nothing of the body is taken
    assert head.startswith(b"HTTP/1.1 200"), head
    return client, re.search(rb"x-request-id: (\S+)", head, re.IGNORECASE).group(1).decode()


def test_a_client_that_stops_reading_its_stream_has_its_answer_cancelled_and_gives_back_its_place(stack):
    gateway, engine = stack
    context = engine.registry_entry()["max_model_len"]
    # a long answer with 20 alternatives per token: more than the connection's buffers hold (the
    # kernel's send buffer grows to a few MiB) before the answer ends
    body = {"model": "tiny-random", "messages": [{"role": "user", "content": "Once upon a time"}],
            "max_tokens": context - 64, "temperature": 0, "stream": True, "logprobs": True, "top_logprobs": 20}
    aborted = sample(engine.metrics_url, "k25_engine_requests_finished_total", finish_reason="abort")
    client, request_id = stop_reading_after_the_headers(gateway.port, body)
    try:
        logged = f"request {request_id}: its client took nothing of the streamed answer for {STALL_S:g} s"
        wait_until(lambda: logged in gateway.log(), timeout_s=120, what="the stalled stream cancelled")
        metrics = f"{gateway.url}/metrics"
        wait_until(lambda: sample(metrics, "k25_gateway_inflight_requests") == 0, timeout_s=30,
                   what="the request's place given back")
        assert sample(metrics, "k25_gateway_stalled_streams_total") == 1
        assert sample(metrics, "k25_gateway_requests_total", status="499") == 1
        wait_until(lambda: sample(engine.metrics_url, "k25_engine_requests_finished_total", finish_reason="abort")
                   == aborted + 1, timeout_s=30, what="the engine aborting the answer")
        assert sample(engine.metrics_url, "k25_engine_requests_finished_total", finish_reason="length") == 0
    finally:
        client.close()
