"""Chaos against `k25 up --engines 2` under steady load: closed-loop senders stream
completions through the official OpenAI client while one part of the stack is hurt, and
each scenario prints what its load saw (`pytest -s` shows it):

(a) an engine gets SIGTERM: it drains (leaves the registry, finishes what it runs, the
    gateway takes what it refuses elsewhere) and starts again; no request fails;
(b) an engine gets SIGKILL: only the streams it was running end, each with an error event;
    nothing hangs, and it starts again;
(c) Redis is restarted (empty): the engines register again; no request fails;
(d) an engine's every step fails (--inject-step-failures-while): after its first failed step
    (--max-failed-steps 1 here; at the default of 3 the gateway, which routes away from an
    engine's errors, sends it the third failing request only minutes later) it says within a
    heartbeat that it is unhealthy and gets no more traffic; only streams it was running when its steps
    began to fail end (with an error event), and it serves again once its steps work;
(e) a pool at zero engines (`k25 up --engines 0 --autoscale`) gets load: its requests wait
    while their own demand starts the first engine; no request fails;
(f) a query of death across three engines (`k25 up --engines 3`): every engine that takes one
    request dies (SIGKILL as soon as its KV events show the request's prompt); the gateway
    tries it on one more engine, then refuses it (502) instead of sending it to the third;
    only the streams the two killed engines were running fail;
(g) registry entries with absurd values (a chunk_size of 2**31, negative or garbage queues)
    are written into Redis beside the engines': the gateway ignores them (it logs each, routes
    nothing to them, learns no pool from them); no request fails;
(h) malformed members of the rollout index (one not UTF-8, one whose state is garbage) are
    added and announced: each engine counts them (k25_engine_unusable_rollout_states) and
    serves on, the gateway ignores them; no request fails;
(i) the chunker hangs (SIGSTOP): completions flow past it, a document request gets 504
    `deadline_exceeded` once the gateway's --chunker-timeout-s (5 s here) has passed, not a
    hang, and document requests are answered again once it resumes (SIGCONT); no completion
    fails;
(j) the gateway gets SIGTERM: it closes its port, finishes its streams, answers a request on
    a kept-alive connection 503 `shutting_down` (`Connection: close`), and `k25 up` starts it
    again; clients that retry (the OpenAI client's max_retries, here 10: about 45 s of
    back-off) lose no request;
(k) a second gateway replica stops reading (SIGSTOP) with streams running: the engines serve
    the first gateway's load on; no request of it fails.

Each scenario begins with the whole stack serving and ends once the hurt part is back and
the load has gone on past that.
"""

import os
import re
import signal
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.prefix_hash import cache_seed, chain_block_hashes
from common.redis_keys import kv_events_channel, live_engines, register_engine, unregister_engine
from common.rollout_keys import rollout_channel, rollout_index_key, rollout_key
from proto import k25_pb2
from services.gateway.api_keys import ANONYMOUS
from tests.helpers.engine_process import wait_until
from tests.helpers.gateway_process import http_json, start_replica, start_stack
from tests.helpers.up_stack import UP_RELEASE, announced, incarnation, part_pid, redis_client, two_engine_stack

pytestmark = pytest.mark.slow

SENDERS = 3
MAX_TOKENS = 32
REQUEST_TIMEOUT_S = 120  # far beyond any answer here, on a busy machine too: a request that takes this long has hung
# completions before the hurt (the load is flowing) and after the recovery (it flows again)
STEADY_COMPLETIONS = 4
RECOVERY_TIMEOUT_S = 180  # an engine's drain (25 s at most) plus a new engine's start, on a busy machine
# how long the gateway waits for the chunker (scenario (i)); cutting the small document below takes milliseconds
CHUNKER_TIMEOUT_S = 5


@dataclass(frozen=True)
class Outcome:
    started: float  # time.monotonic()
    ended: float
    result: str  # "completed", "error event: CODE", "http STATUS", "connection error", "timeout", "no finish"


class Load:
    """SENDERS closed-loop senders of streamed completions, from `with` until its end, which
    prints what they saw (also when the scenario failed)."""

    def __init__(self, base_url: str, scenario: str, max_retries: int = 0):
        self.scenario = scenario
        self.client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=max_retries,
                                    timeout=REQUEST_TIMEOUT_S)
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._senders = [threading.Thread(target=self._send, daemon=True) for _ in range(SENDERS)]

    def __enter__(self) -> "Load":
        for sender in self._senders:
            sender.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        for sender in self._senders:
            sender.join(timeout=REQUEST_TIMEOUT_S + 30)
        self.report()
        assert not any(sender.is_alive() for sender in self._senders), "a sender hung past its request timeout"

    def _send(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            result = self._one()
            self.outcomes.append(Outcome(started, time.monotonic(), result))

    def _one(self) -> str:
        try:
            finish = None
            for chunk in self.client.completions.create(model="tiny-random", prompt="Hi", max_tokens=MAX_TOKENS, stream=True):
                finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
            return "completed" if finish else "no finish"
        except openai.APIStatusError as exc:
            return f"http {exc.status_code}"
        except openai.APITimeoutError:
            return "timeout"
        except openai.APIConnectionError:
            return "connection error"
        except openai.APIError as exc:  # an error event in the stream
            return f"error event: {(exc.body or {}).get('code')}"

    def completed(self) -> int:
        return sum(o.result == "completed" for o in self.outcomes)

    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.result != "completed"]

    def report(self) -> None:
        failures = Counter(o.result for o in self.failed())
        print(f"\nchaos {self.scenario}: sent {len(self.outcomes)}, completed {self.completed()}, failed {len(self.failed())}"
              + (f" ({', '.join(f'{n} {r}' for r, n in failures.items())})" if failures else ""))


# while this file exists in the stack's log folder, that engine's every step fails
FAULT_FILE = "fail-steps-{engine_id}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    faults = tmp_path_factory.mktemp("faults")
    stack_flags = [f"--engine-flag=--inject-step-failures-while={faults / FAULT_FILE}", "--engine-flag=--max-failed-steps=1",
                   f"--gateway-flag=--chunker-timeout-s={CHUNKER_TIMEOUT_S}",
                   # no adapters, but their rollout watcher runs (scenario (h))
                   f"--adapter-root={tmp_path_factory.mktemp('adapters')}"]
    for service in two_engine_stack(tmp_path_factory, "chaos", *stack_flags):
        service.faults = faults
        yield service


def whole(stack) -> bool:
    try:
        status, _, body = http_json(f"{stack.url}/readyz", timeout_s=5)
    except OSError:
        return False
    return status == 200 and body["engines"] == 2 and body["redis"] == "ok"


def under_load(stack, scenario: str, hurt, back, max_retries: int = 0) -> tuple[Load, float]:
    """Run the load (its client retrying each request `max_retries` times), `hurt()` the stack
    once it flows, keep on until `back()` and past it; returns the load and when the hurt came."""
    wait_until(lambda: whole(stack), timeout_s=RECOVERY_TIMEOUT_S, interval_s=0.5, what="the whole stack serving")
    with Load(stack.url, scenario, max_retries) as load:
        wait_until(lambda: load.completed() >= STEADY_COMPLETIONS, timeout_s=RECOVERY_TIMEOUT_S, what="the load flowing")
        hurt_at = time.monotonic()
        hurt()
        wait_until(back, timeout_s=RECOVERY_TIMEOUT_S, interval_s=0.2, what=f"recovery from {scenario}")
        settled = load.completed()
        wait_until(lambda: load.completed() >= settled + STEADY_COMPLETIONS, timeout_s=RECOVERY_TIMEOUT_S,
                   what="the load flowing again")
    return load, hurt_at


def engine_comes_back(stack, engine: str):
    client = redis_client(stack)
    first = incarnation(client, engine)
    return lambda: incarnation(client, engine) not in (None, first)


def test_a_sigtermed_engine_drains_and_no_request_fails(stack):
    """Needs the engine's drain on SIGTERM and the gateway taking refused work elsewhere."""
    back = engine_comes_back(stack, "engine-default-0")
    load, _ = under_load(stack, "(a) engine SIGTERM", lambda: os.kill(part_pid(stack, "engine-default-0"), signal.SIGTERM), back)
    assert load.failed() == []


def test_a_sigkilled_engine_fails_only_the_streams_it_was_running_and_nothing_hangs(stack):
    back = engine_comes_back(stack, "engine-default-1")
    load, killed_at = under_load(stack, "(b) engine SIGKILL", lambda: os.kill(part_pid(stack, "engine-default-1"), signal.SIGKILL), back)
    failed = load.failed()
    assert all(o.result.startswith("error event") for o in failed), failed  # mid-stream, not refused, not hung
    assert all(o.started < killed_at for o in failed), "a request sent after the kill failed"
    assert len(failed) <= SENDERS  # at most one stream in flight per sender


def test_a_restarted_redis_fails_no_request(stack):
    client = redis_client(stack)
    redis_starts = len(re.findall(r"^k25 up: redis\s+started again", stack.log(), re.M))

    def back() -> bool:
        restarted = len(re.findall(r"^k25 up: redis\s+started again", stack.log(), re.M)) > redis_starts
        return restarted and all(incarnation(client, e) for e in ("engine-default-0", "engine-default-1"))

    load, _ = under_load(stack, "(c) Redis restart", lambda: os.kill(part_pid(stack, "redis"), signal.SIGTERM), back)
    assert load.failed() == []


def test_an_engine_whose_every_step_fails_loses_its_traffic_and_nothing_fails_after(stack):
    client = redis_client(stack)
    fault = stack.faults / FAULT_FILE.format(engine_id="engine-default-0")
    noticed_at = []

    def unhealthy() -> bool:  # the engine's own heartbeat says so: the gateway routes by that
        entry = live_engines(client, "k25").get("engine-default-0") or {}
        if entry.get("healthy") is False and not noticed_at:
            noticed_at.append(time.monotonic())
        return bool(noticed_at)

    try:
        load, hurt_at = under_load(stack, "(d) every step of an engine fails", fault.touch, unhealthy)
    finally:
        fault.unlink(missing_ok=True)
    failed = load.failed()
    assert all(o.result.startswith("error event") and o.started < hurt_at for o in failed), failed
    assert len(failed) <= SENDERS  # at most the stream each sender had on that engine
    assert sum(o.result == "completed" and o.started > noticed_at[0] for o in load.outcomes) >= STEADY_COMPLETIONS
    wait_until(lambda: (live_engines(client, "k25").get("engine-default-0") or {}).get("healthy") is True,
               timeout_s=RECOVERY_TIMEOUT_S, what="the engine healthy again once its steps work")


STACK_ENGINES = ("engine-default-0", "engine-default-1")


def gateway_log(stack) -> str:
    return (Path(stack.log_path).parent / "gateway.log").read_text(errors="replace")


def test_absurd_registry_entries_are_ignored_and_no_request_fails(stack):
    """Each fake entry is a real engine's, made attractive (all its KV free, no queue) and
    absurd in one way; a gateway that routed to one would send requests to an address nobody serves."""
    client = redis_client(stack)
    absurd = {
        "engine-fake-huge": {"chunk_size": 2**31, "max_model_len": 2**40},
        "engine-fake-negative": {"pool": "absurd", "running": -5, "waiting": -1_000_000},
        "engine-fake-garbage": {"waiting": "lots", "max_waiting": None},
    }

    def hurt() -> None:
        real = live_engines(client, UP_RELEASE)[STACK_ENGINES[0]]
        for engine_id, values in absurd.items():
            entry = {**real, "address": "127.0.0.1:9", "incarnation": engine_id, "free_kv_fraction": 1.0, **values}
            register_engine(client, UP_RELEASE, engine_id, entry, ttl_s=2 * RECOVERY_TIMEOUT_S)

    def ignored() -> bool:
        log = gateway_log(stack)
        return all(f"registry: ignoring engine {engine_id}:" in log for engine_id in absurd)

    try:
        load, _ = under_load(stack, "(g) absurd registry entries", hurt, ignored)
        status, _, ready = http_json(f"{stack.url}/readyz", timeout_s=5)
    finally:
        for engine_id in absurd:
            unregister_engine(client, UP_RELEASE, engine_id)
    assert load.failed() == []
    assert (status, ready["engines"], ready["unroutable_engines"]) == (200, 2, 0)
    assert "absurd" not in ready["pools"]  # no pool learned from an ignored entry


def engine_gauge(stack, engine: str, name: str) -> float | None:
    """A gauge of the engine's /metrics, or None while it does not answer."""
    try:
        with urllib.request.urlopen(announced(stack, engine)[-1]["metrics"], timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    return next((sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                 if sample.name == name), None)


def test_malformed_rollout_index_members_are_skipped_and_no_request_fails(stack):
    client = redis_client(stack)
    members = [b"\xff\xfe-not-text", b"chaos-garbage"]

    def hurt() -> None:
        client.hset(rollout_key(UP_RELEASE, "chaos-garbage"), mapping={"phase": b"\xff\xfe", "generation": "many"})
        client.sadd(rollout_index_key(UP_RELEASE), *members)
        for member in members:  # as the operator announces a change: every engine reads it at once
            client.publish(rollout_channel(UP_RELEASE), member)

    def skipped() -> bool:
        log = gateway_log(stack)
        by_gateway = all(f"registry: ignoring rollout {name}:" in log for name in (repr(members[0]), "chaos-garbage"))
        return by_gateway and all(engine_gauge(stack, e, "k25_engine_unusable_rollout_states") == len(members)
                                  for e in STACK_ENGINES)

    try:
        load, _ = under_load(stack, "(h) malformed rollout index members", hurt, skipped)
    finally:
        client.srem(rollout_index_key(UP_RELEASE), *members)
        client.delete(rollout_key(UP_RELEASE, "chaos-garbage"))
    assert load.failed() == []


DOCUMENT = {"text": "Article 1. Terms.\n\nArticle 2. Fees.", "passage_tokens": 256}


def test_a_hung_chunker_fails_document_requests_with_504_and_no_completion(stack):
    wait_until(lambda: whole(stack), timeout_s=RECOVERY_TIMEOUT_S, interval_s=0.5, what="the whole stack serving")
    chunker = part_pid(stack, "chunker")
    asked = {}

    def ask() -> None:
        try:
            asked["reply"] = http_json(f"{stack.url}/v1/chunks", DOCUMENT, timeout_s=REQUEST_TIMEOUT_S)
        except OSError as exc:  # hung past REQUEST_TIMEOUT_S, or the connection failed
            asked["reply"] = exc

    with Load(stack.url, "(i) a hung chunker") as load:
        wait_until(lambda: load.completed() >= STEADY_COMPLETIONS, timeout_s=RECOVERY_TIMEOUT_S, what="the load flowing")
        os.kill(chunker, signal.SIGSTOP)
        try:
            asker = threading.Thread(target=ask)
            asker.start()
            hung = load.completed()
            wait_until(lambda: load.completed() >= hung + STEADY_COMPLETIONS, timeout_s=RECOVERY_TIMEOUT_S,
                       what="the load flowing past the hung chunker")
            asker.join(timeout=REQUEST_TIMEOUT_S + 30)
        finally:
            os.kill(chunker, signal.SIGCONT)
        wait_until(lambda: http_json(f"{stack.url}/v1/chunks", DOCUMENT, timeout_s=REQUEST_TIMEOUT_S)[0] == 200,
                   timeout_s=RECOVERY_TIMEOUT_S, interval_s=0.2, what="document requests answered once the chunker resumes")
    assert load.failed() == []
    status, _, body = asked["reply"]
    assert status == 504, body
    assert (body["error"]["type"], body["error"]["code"]) == ("server_error", "deadline_exceeded")


# the OpenAI client's retries of one request: its back-off (0.5 s doubling to 8 s) then spans about
# 45 s, beyond the gateway's drain of its streams, k25 up's restart delay and its start on a busy machine
GATEWAY_RESTART_RETRIES = 10


def test_a_restarted_gateway_loses_no_request_of_clients_that_retry(stack):
    stopped = part_pid(stack, "gateway")

    def back() -> bool:
        return part_pid(stack, "gateway") not in (None, stopped) and whole(stack)

    load, _ = under_load(stack, "(j) gateway SIGTERM", lambda: os.kill(stopped, signal.SIGTERM), back,
                         max_retries=GATEWAY_RESTART_RETRIES)
    assert load.failed() == []


# the stopped replica's own streams: long enough to be running through the stop
REPLICA_MAX_TOKENS = 400


def test_a_gateway_that_stops_reading_costs_the_other_gateway_nothing(stack, tmp_path):
    """A second gateway replica on the stack streams answers, then stops reading (SIGSTOP: hung,
    partitioned): the engines go on generating for it while the first gateway's load goes on.
    End to end ZMQ's and the kernel's buffers absorb a stopped reader's frames for minutes (the
    engine's per-peer bound behind them is tests/engine/serve/test_engine_outbox.py's); what the
    stopped replica's own clients get after it resumes is its own and only printed."""
    wait_until(lambda: whole(stack), timeout_s=RECOVERY_TIMEOUT_S, interval_s=0.5, what="the whole stack serving")
    replica = start_replica(part_pid(stack, "gateway"), str(tmp_path / "replica.log"))
    client = openai.OpenAI(base_url=f"{replica.url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    first_tokens = threading.Barrier(SENDERS + 1)

    def stream_long(outcomes: list) -> None:
        try:
            stream = client.completions.create(model="tiny-random", prompt="Hi", stream=True, max_tokens=REPLICA_MAX_TOKENS)
            chunks = iter(stream)
            next(chunks)
            first_tokens.wait()
            outcomes.append(sum(1 for _ in chunks))
        except (openai.APIError, threading.BrokenBarrierError) as exc:
            outcomes.append(type(exc).__name__)

    replica_outcomes: list = []
    streams = [threading.Thread(target=stream_long, args=(replica_outcomes,), daemon=True) for _ in range(SENDERS)]
    try:
        for thread in streams:
            thread.start()
        first_tokens.wait(timeout=RECOVERY_TIMEOUT_S)  # each of its streams is running
        # the load goes on past the stop (it is "back" at once: nothing of the stack recovers)
        load, _ = under_load(stack, "(k) a gateway replica stops reading",
                             lambda: os.kill(replica.process.pid, signal.SIGSTOP), lambda: True)
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
        for thread in streams:
            thread.join(timeout=REQUEST_TIMEOUT_S)
        replica.stop(signal.SIGKILL)
    print(f"(k) the stopped replica's streams after it resumed: {replica_outcomes}")
    assert load.failed() == []


@pytest.fixture
def empty_pool_stack(tmp_path):
    # requests wait for the first engine up to --engine-wait-s (30 s by default), then get 503: on a
    # busy machine starting an engine can take longer than that, and this scenario is about the wake-up
    service = start_stack(str(tmp_path / "up.log"), "--model", "tiny-random", "--engines", "0", "--autoscale",
                          "--max-engines", "1", "--autoscale-interval-s", "0.5", "--log-dir", str(tmp_path),
                          f"--gateway-flag=--engine-wait-s={RECOVERY_TIMEOUT_S}")
    yield service
    service.stop(signal.SIGINT)


def test_a_pool_at_zero_is_woken_by_its_own_demand_and_no_request_fails(empty_pool_stack):
    stack = empty_pool_stack
    status, _, body = http_json(f"{stack.url}/readyz", timeout_s=5)
    assert (status, body["engines"]) == (200, 0)  # serving, with no engine yet
    with Load(stack.url, "(e) scale from zero") as load:
        wait_until(lambda: load.completed() >= STEADY_COMPLETIONS, timeout_s=RECOVERY_TIMEOUT_S, what="the load flowing")
    assert load.failed() == []
    # the engine its demand started registered (k25 up printed it); it may be gone again by now: on a
    # slow machine the autoscaler can read the window's QPS as 0 and scale the pool down (it drains)
    assert announced(stack, "engine-default-0")


@pytest.fixture
def three_engine_stack(tmp_path):
    service = start_stack(str(tmp_path / "up.log"), "--model", "tiny-random", "--engines", "3", "--log-dir", str(tmp_path))
    yield service
    service.stop(signal.SIGINT)


ENGINES = ("engine-default-0", "engine-default-1", "engine-default-2")
# the query of death: a prompt of its own (no load request shares its prefix blocks), asking for
# the whole context so that it is still running when its engine is found and killed
DEADLY_PROMPT = [(7919 * i) % 997 + 3 for i in range(64)]


def test_a_query_of_death_kills_two_engines_at_most_and_is_refused(three_engine_stack):
    stack, client = three_engine_stack, redis_client(three_engine_stack)
    wait_until(lambda: sum(incarnation(client, e) is not None for e in ENGINES) == 3, timeout_s=RECOVERY_TIMEOUT_S,
               what="three engines registered")
    first = {e: incarnation(client, e) for e in ENGINES}
    block_size = live_engines(client, "k25")[ENGINES[0]]["block_size"]
    deadly_blocks = set(chain_block_hashes(DEADLY_PROMPT, block_size, cache_seed("", ANONYMOUS.tenant)))
    events = client.pubsub(ignore_subscribe_messages=True)
    events.subscribe(kv_events_channel("k25"))
    killed, kills_at, answer = [], [], {}

    def holder() -> str | None:
        """The engine whose prefix cache took the deadly prompt's blocks, if one did since the last look."""
        message = events.get_message(timeout=0.2)
        if message is None:
            return None
        event = k25_pb2.KVEvents.FromString(message["data"])
        return event.engine_id if deadly_blocks & set(event.stored) and event.engine_id not in killed else None

    def ask() -> None:
        answer["reply"] = http_json(f"{stack.url}/v1/completions", {"model": "tiny-random", "prompt": DEADLY_PROMPT,
                                    "max_tokens": 8000, "temperature": 0}, timeout_s=600)

    with Load(stack.url, "(f) a query of death across three engines") as load:
        wait_until(lambda: load.completed() >= STEADY_COMPLETIONS, timeout_s=RECOVERY_TIMEOUT_S, what="the load flowing")
        asker = threading.Thread(target=ask)
        asker.start()
        while len(killed) < 2:
            engine = wait_until(holder, timeout_s=RECOVERY_TIMEOUT_S, interval_s=0, what="an engine taking the query")
            kills_at.append(time.monotonic())
            os.kill(part_pid(stack, engine), signal.SIGKILL)
            killed.append(engine)
        asker.join(timeout=600)
        wait_until(lambda: all(incarnation(client, e) not in (None, first[e]) for e in killed),
                   timeout_s=RECOVERY_TIMEOUT_S, what="the killed engines starting again")
        settled = load.completed()
        wait_until(lambda: load.completed() >= settled + STEADY_COMPLETIONS, timeout_s=RECOVERY_TIMEOUT_S,
                   what="the load flowing again")
    events.close()
    status, headers, body = answer["reply"]
    assert status == 502 and body["error"]["code"] == "request_crashed_engines", body
    [spared] = [e for e in ENGINES if e not in killed]
    assert incarnation(client, spared) == first[spared]  # never killed: the query never reached it
    # a stream the kills cut ends with an error event; one that lost both engines before its first
    # token (sent to the first as it died, then to the second) is refused by its own crash budget
    failed = load.failed()
    assert all(o.result.startswith("error event") or o.result == "http 502" for o in failed), failed
    assert all(o.started < kills_at[-1] for o in failed), failed
    assert len(failed) <= 2 * SENDERS  # at most the streams each sender had on the two killed engines
