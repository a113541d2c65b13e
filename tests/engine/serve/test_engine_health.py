"""Engine health: the policy as a pure function, then a real server (tiny-random) whose steps
fail or wedge through the engine's `before_forward` seam, seen the way the rest of K25 sees
it: the heartbeat entry in a real Redis, /healthz on the metrics port, and the answers a real
DEALER gets."""

import threading
import time
from dataclasses import dataclass

import pytest
import redis
import zmq

from common.redis_keys import live_engines
from engine.base.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.serve.health import FAILURE_WINDOW_S, HealthSettings, StepHealth, unhealthy_reason
from engine.serve.heartbeat import Heartbeat, registry_client
from engine.serve.registry import EngineProfile, registry_entry
from engine.serve.server import EngineServer, ServerSettings
from proto import k25_pb2
from tests.helpers.engine_process import dealer, generate_message, receive_until_done, send, wait_until
from tests.helpers.http_json import get_json
from tests.helpers.redis_server import redis_server  # noqa: F401  (fixture)

CHUNK = 32
RELEASE = "test"
SETTINGS = HealthSettings(max_failed_steps=3, step_stall_s=60)


@pytest.mark.parametrize("failed_in_a_row, busy_since, last_step_done, now, fragment", [
    (0, None, None, 1000.0, ""),  # never stepped, nothing to do
    (2, None, 10.0, 11.0, ""),  # failures below the limit
    (3, None, 10.0, 11.0, "its last 3 steps failed"),
    (3, 5.0, 10.0, 11.0, "its last 3 steps failed"),
    (0, 0.0, None, 60.0, ""),  # busy for exactly the stall limit: not yet
    (0, 0.0, None, 61.0, "no step finished for 61 s"),
    (0, 0.0, 50.0, 100.0, ""),  # busy for long, but a step finished 50 s ago
    (0, 0.0, 30.0, 100.0, "no step finished for 70 s"),
    (0, 100.0, 10.0, 150.0, ""),  # work came 50 s ago after a long idle time: idle time is no stall
    (0, None, 10.0, 1000.0, ""),  # idle for long: nothing to step, nothing stalled
])
def test_unhealthy_reason(failed_in_a_row, busy_since, last_step_done, now, fragment):
    reason = unhealthy_reason(failed_in_a_row, busy_since, last_step_done, now, SETTINGS)
    assert (fragment in reason) if fragment else reason == ""


def test_failures_count_in_a_row_and_in_the_window_and_a_good_step_heals():
    health = StepHealth(SETTINGS)
    assert health.report().healthy and health.report().last_step_at is None
    for _ in range(3):
        health.step_finished(failed=True)
    report = health.report()
    assert not report.healthy and health.failing and report.step_failures == 3
    health.step_finished(failed=None)  # a step that ran no forward proves nothing
    assert health.failing
    before = time.time()
    health.step_finished(failed=False)
    report = health.report()
    assert report.healthy and not health.failing and report.reason == ""
    assert report.step_failures == 3  # still within the last FAILURE_WINDOW_S
    assert before <= report.last_step_at <= time.time()
    assert FAILURE_WINDOW_S == 60.0  # what the README and the heartbeat's users are told


@pytest.mark.parametrize("settings, fragment", [
    (HealthSettings(max_failed_steps=0), "max_failed_steps"),
    (HealthSettings(step_stall_s=0), "step_stall_s"),
])
def test_settings_that_could_never_be_healthy_are_refused(settings, fragment):
    with pytest.raises(ValueError, match=fragment):
        StepHealth(settings)


# --- a real server --------------------------------------------------------------------------------


@dataclass
class Serving:
    server: EngineServer
    peer: zmq.Socket
    redis: redis.Redis
    metrics_port: int

    def entry(self) -> dict:
        return wait_until(lambda: live_engines(self.redis, RELEASE).get("e1"), what="the engine's registry entry")

    def unhealthy_entry(self) -> dict:
        def unhealthy():
            entry = self.entry()
            return None if entry["healthy"] else entry
        return wait_until(unhealthy, what="the heartbeat saying unhealthy")

    def healthz(self) -> tuple[int, dict]:
        return get_json(f"http://127.0.0.1:{self.metrics_port}/healthz")

    def ask(self, prompt: list[int], **sampling) -> list[k25_pb2.EngineMessage]:
        message = generate_message(prompt, CHUNK, max_tokens=4, **sampling)
        send(self.peer, message)
        return receive_until_done(self.peer, message.generate.request_id)

    def set_before_forward(self, hook) -> None:
        self.server.call_between_steps(lambda: setattr(self.server.engine.runner, "before_forward", hook)).result(timeout=30)


@pytest.fixture
def serve(tiny_model, redis_server):  # noqa: F811
    """Start a server with these health settings, heartbeating into a private Redis, /healthz on a free port."""
    started = []

    def start(health: HealthSettings) -> Serving:
        engine = LLMEngine(tiny_model, EngineConfig(chunk_size=CHUNK, max_chunk_per_gpu=64))
        server = EngineServer(engine, ServerSettings(port=0, bind_host="127.0.0.1", idle_poll_ms=10, health=health,
                                                     health_probe_interval_s=0.2))
        metrics_port = server.metrics.serve(0, "127.0.0.1", lambda: server.health_report().fields())
        profile = EngineProfile("e1", f"127.0.0.1:{server.port}", "default", "cpu", "tiny-random", CHUNK, 64,
                                64 * CHUNK, 2048, 0.92, 1024, 5.0)
        heartbeat = Heartbeat(registry_client(redis_server), RELEASE, "e1",
                              lambda: registry_entry(profile, server.stats, server.health_report()), interval_s=0.05, ttl_s=5)
        stop = threading.Event()
        thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
        thread.start()
        heartbeat.start()
        serving = Serving(server, dealer(f"tcp://127.0.0.1:{server.port}"), redis.Redis.from_url(redis_server), metrics_port)
        started.append((serving, heartbeat, stop, thread))
        return serving

    yield start
    for serving, heartbeat, stop, thread in started:
        serving.server.engine.runner.before_forward = None
        heartbeat.stop()
        stop.set()
        thread.join(timeout=30)
        serving.peer.close()
        serving.server.close()
        serving.server.metrics.close()


@pytest.fixture(scope="module")
def prompt(tiny_model) -> list[int]:
    return tiny_model.tokenizer.encode("The contract says that the tenant")


def fail_the_step(batch):
    raise RuntimeError("injected step failure")


def test_failing_steps_make_the_engine_unhealthy_and_one_good_step_heals_it(serve, prompt):
    serving = serve(HealthSettings(max_failed_steps=3, step_stall_s=600))
    assert serving.entry()["healthy"] is True and serving.healthz()[0] == 200
    started = time.time()
    serving.set_before_forward(fail_the_step)
    for _ in range(3):  # one request per step: each step fails
        (reply,) = serving.ask(prompt)
        assert reply.error.code == k25_pb2.INTERNAL and "injected step failure" in reply.error.message

    entry = serving.unhealthy_entry()
    assert "steps failed" in entry["unhealthy_reason"] and entry["step_failures"] >= 3  # its own probes fail too
    assert started <= entry["last_step_at"] <= time.time() and entry["draining"] is False
    status, body = serving.healthz()
    assert status == 503 and body["healthy"] is False and "steps failed" in body["unhealthy_reason"]
    (refused,) = serving.ask(prompt)  # refused before anything is done: the gateway retries it elsewhere
    assert refused.error.code == k25_pb2.CANCELLED and "unhealthy" in refused.error.message

    serving.set_before_forward(None)  # the fault is gone: the engine's own probe step succeeds
    wait_until(lambda: serving.entry()["healthy"], what="the heartbeat saying healthy again")
    status, body = serving.healthz()
    assert status == 200 and body["healthy"] is True and body["unhealthy_reason"] == ""
    replies = serving.ask(prompt)
    assert replies[-1].final.usage.completion_tokens == 4


def test_a_wedged_step_makes_the_engine_unhealthy_until_it_finishes(serve, prompt):
    serving = serve(HealthSettings(max_failed_steps=3, step_stall_s=0.3))
    wedge = threading.Event()
    serving.set_before_forward(lambda batch: wedge.wait(120))
    message = generate_message(prompt, CHUNK, max_tokens=4)
    send(serving.peer, message)
    try:
        entry = serving.unhealthy_entry()
        assert "no step finished" in entry["unhealthy_reason"] and entry["step_failures"] == 0
        status, body = serving.healthz()
        assert status == 503 and "no step finished" in body["unhealthy_reason"]
    finally:
        serving.server.engine.runner.before_forward = None
        wedge.set()
    replies = receive_until_done(serving.peer, message.generate.request_id)
    assert replies[-1].final.usage.completion_tokens == 4  # the step was slow, not failed
    wait_until(lambda: serving.entry()["healthy"] and serving.healthz()[0] == 200, what="healthy again")
