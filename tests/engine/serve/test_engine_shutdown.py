"""`k25 engine` under real signals: SIGTERM takes it out of the registry and out of the
gateways' prefix indexes at once, refuses new requests with CANCELLED while running ones go
on, and the drain's end (its timeout, or a second signal) ends what still runs with CANCELLED;
it exits 0. What a drain does step by step is in test_engine_drain.py.

The running request asks for ENDLESS tokens: far more than the engine makes while the test
signals it, so it is still running whenever the test needs it to be."""

import signal

import pytest
import redis

from common.redis_keys import kv_events_channel
from proto import k25_pb2
from tests.helpers.engine_process import (
    RELEASE,
    dealer,
    generate_message,
    receive,
    receive_until_done,
    request_id_of,
    send,
    start_engine,
    wait_until,
)
from tests.helpers.http_json import get_json
from tests.helpers.redis_server import redis_server  # noqa: F401 (fixture)

CHUNK = 32
ENDLESS = 8000  # the engine's context is 256 chunks x 32 = 8,192 tokens


@pytest.fixture
def start(redis_server, tmp_path):  # noqa: F811
    engines = []

    def start(*flags):
        engine = start_engine(redis_server, str(tmp_path / f"engine{len(engines)}.log"), "--model", "tiny-random",
                              "--chunk-size", str(CHUNK), "--max-chunk-per-gpu", "256", *flags)
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        if engine.process.poll() is None:
            engine.process.kill()
            engine.process.wait()


@pytest.fixture
def prompt(tiny_model) -> list[int]:
    tokens = tiny_model.tokenizer.encode("The contract says that the tenant pays the rent on the first day of each month. " * 3)
    assert len(tokens) > 32  # whole KV blocks: their hashes are announced
    return tokens


class KVEvents:
    """The engine's prefix-cache announcements, as a gateway receives them."""

    def __init__(self, redis_url: str):
        self.pubsub = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(kv_events_channel(RELEASE))

    def next(self, timeout_s: float = 30) -> k25_pb2.KVEvents | None:
        message = self.pubsub.get_message(timeout=timeout_s)
        return k25_pb2.KVEvents.FromString(message["data"]) if message else None

    def until(self, condition, what: str) -> k25_pb2.KVEvents:
        def matching():
            event = self.next(timeout_s=1)
            return event if event is not None and condition(event) else None
        return wait_until(matching, timeout_s=60, what=what)

    def rest(self) -> list[k25_pb2.KVEvents]:
        events = []
        while (event := self.next(timeout_s=0.2)) is not None:
            events.append(event)
        return events


def start_endless(engine, prompt) -> tuple:
    client = dealer(engine.address)
    message = generate_message(prompt, CHUNK, max_tokens=ENDLESS, ignore_eos=True)
    send(client, message)
    assert receive(client).delta.request_id == message.generate.request_id  # it streams
    return client, message.generate.request_id


def test_sigterm_on_an_idle_engine_leaves_the_registry_clears_its_cache_announcements_and_exits_zero(
        start, redis_server, prompt):  # noqa: F811
    engine = start("--drain-timeout-s", "600")
    events = KVEvents(redis_server)
    client = dealer(engine.address)
    message = generate_message(prompt, CHUNK, max_tokens=2)
    send(client, message)
    assert receive_until_done(client, message.generate.request_id)[-1].final.usage.completion_tokens == 2
    events.until(lambda e: e.engine_id == engine.engine_id and e.stored, "the engine announcing cached blocks")

    engine.process.terminate()

    assert engine.process.wait(timeout=60) == 0  # nothing ran: it did not wait out its 600 s drain
    assert engine.registry_entry() is None
    assert events.until(lambda e: e.engine_id == engine.engine_id and e.cleared, "the engine's last announcement").cleared
    assert "Traceback" not in engine.log()
    client.close()


def test_sigterm_refuses_new_requests_while_running_ones_go_on_and_a_second_signal_cancels_them(
        start, redis_server, prompt):  # noqa: F811
    engine = start("--drain-timeout-s", "600")
    events = KVEvents(redis_server)
    client, endless = start_endless(engine, prompt)
    events.until(lambda e: e.engine_id == engine.engine_id and e.stored, "the engine announcing cached blocks")

    engine.process.terminate()

    wait_until(lambda: engine.registry_entry() is None, what="the engine leaving the registry")
    events.until(lambda e: e.engine_id == engine.engine_id and e.cleared, "the engine telling gateways to forget its blocks")
    late = generate_message(prompt, CHUNK, max_tokens=2)
    send(client, late)
    while (message := receive(client)).WhichOneof("kind") == "delta":
        assert message.delta.request_id == endless  # the running request goes on
    assert request_id_of(message) == late.generate.request_id
    assert message.error.code == k25_pb2.CANCELLED and "draining" in message.error.message
    status, health = get_json(engine.metrics_url.replace("/metrics", "/healthz"))
    assert status == 200 and health["draining"] is True and health["healthy"] is True  # a liveness probe lets it drain

    engine.process.send_signal(signal.SIGTERM)

    last = receive_until_done(client, endless)[-1]
    assert last.error.code == k25_pb2.CANCELLED and "second stop signal" in last.error.message
    assert engine.process.wait(timeout=60) == 0
    assert not [e for e in events.rest() if e.stored]  # nothing announced after the cleared
    assert "Traceback" not in engine.log()
    client.close()


def test_what_runs_past_the_drain_timeout_ends_cancelled(start, prompt):
    engine = start("--drain-timeout-s", "0")
    client, endless = start_endless(engine, prompt)

    engine.process.send_signal(signal.SIGINT)  # Ctrl-C drains too

    last = receive_until_done(client, endless)[-1]
    assert last.error.code == k25_pb2.CANCELLED and "drain timeout of 0 s passed" in last.error.message
    assert engine.process.wait(timeout=60) == 0
    assert engine.registry_entry() is None
    client.close()
