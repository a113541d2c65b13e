"""The chunker's liveness answer: healthy while its serving loop comes round, 503 once it has
not for `stuck_after_s` (a document that never ends). The judgement is a pure function; the
server's answer is read at a chosen moment rather than by waiting for it to go stale."""

import threading

import pytest

from common.tokenizer import load_tokenizer
from services.chunker.chunker import Chunker
from services.chunker.server import ChunkerServer, ChunkerSettings, loop_health
from tests.helpers.http_json import get_json


def test_a_loop_that_came_round_within_the_limit_is_healthy():
    assert loop_health(0.0, 120)["healthy"] is True
    assert loop_health(120.0, 120)["healthy"] is True


def test_a_loop_that_has_not_come_round_is_stuck_and_says_for_how_long():
    body = loop_health(121.0, 120)
    assert body["healthy"] is False
    assert body["seconds_since_loop_turned"] == 121.0
    assert "121 s" in body["reason"] and "120 s" in body["reason"]


@pytest.fixture
def server():
    served = ChunkerServer(Chunker(load_tokenizer("smollm2-135m")), ChunkerSettings(port=0, bind_host="127.0.0.1"))
    stop = threading.Event()
    thread = threading.Thread(target=served.serve, args=(stop,))
    thread.start()
    yield served
    stop.set()
    thread.join()
    served.metrics.close()
    served.close()


def test_healthz_answers_from_the_serving_loop(server):
    port = server.metrics.serve(0, "127.0.0.1", server.health)
    status, body = get_json(f"http://127.0.0.1:{port}/healthz")
    assert status == 200 and body["healthy"] is True
    stuck = server.health(now=server.last_turn + server.settings.stuck_after_s + 1)
    assert stuck["healthy"] is False and "has not turned" in stuck["reason"]
