"""A query of death against real engines: a request whose engine dies is tried on one more
engine, and when that one dies too it is refused (502, logged with its id) instead of being
sent on until the whole fleet is down. Engines are real processes on real Redis; "dies" is
SIGKILL, as a crash in prefill or an OOM kill would end them.

Before the first token (dispatch.py's own loop): the dispatcher runs in-process, so that the
test sees when the request is sent; the engine it goes to first is frozen (SIGSTOP) so that
it cannot answer before it is killed, and is the first by the routing's own preference (the
prefix index says it holds the prompt). After the first token (the gateway's restart of a
non-streamed answer): through `k25 gateway`, killing whichever engine runs the request."""

import asyncio
import signal
import threading
import time

import pytest
import redis

from common.redis_keys import live_engines
from proto import k25_pb2
from services.gateway.dispatch import Dispatcher, Job
from services.gateway.engine_client import EngineConnections
from services.gateway.engine_errors import RecentErrors
from services.gateway.errors import OpenAIError
from services.gateway.metrics import GatewayMetrics
from services.gateway.prefix_index import PrefixIndex
from services.gateway.routing import EngineView
from tests.helpers.engine_process import RELEASE, start_engine, wait_until
from tests.helpers.gateway_process import http_json, start_gateway
from tests.helpers.redis_server import free_port, start_redis_server

pytestmark = pytest.mark.slow

CHUNK = 64
TINY = ("--model", "tiny-random", "--chunk-size", str(CHUNK))
PATIENCE_S = 120  # for a loaded 2-core machine; each wait ends as soon as what it waits for happens


@pytest.fixture(scope="module")
def redis_url():
    port = free_port()
    process = start_redis_server(port)
    yield f"redis://127.0.0.1:{port}/0"
    process.kill()
    process.wait()


@pytest.fixture
def engines(redis_url, tmp_path):
    """start(name) starts an engine; all are stopped after the test (killed ones too)."""
    started = []

    def start(name: str):
        engine = start_engine(redis_url, str(tmp_path / f"{name}.log"), *TINY, engine_id=name)
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.process.kill()
        engine.process.wait()


def views(redis_url: str) -> dict[str, EngineView]:
    entries = live_engines(redis.Redis.from_url(redis_url), RELEASE)
    return {engine_id: EngineView.from_entry(engine_id, entry) for engine_id, entry in entries.items()}


def job() -> Job:
    return Job(request_id="cmpl-qod", tenant="t", model="tiny-random", prompt_token_ids=list(range(5, 5 + 2 * CHUNK)),
               sampling=k25_pb2.SamplingParams(max_tokens=4, temperature=0), deadline=time.time() + 600)


async def until(condition, what: str):
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {PATIENCE_S} s"
        await asyncio.sleep(0.01)


async def open_where_first_dies(redis_url: str, doomed, other, request: Job):
    """Open `request` on [doomed, other] with doomed preferred and frozen; kill doomed once the
    request is sent there. Returns (the open's result or error, the connections' open requests on other)."""
    engine_views = views(redis_url)
    first, second = engine_views[doomed.engine_id], engine_views[other.engine_id]
    index = PrefixIndex(10_000)
    index.record(first.engine_id, first.incarnation, request.block_hashes(first.block_size))
    connections = EngineConnections()
    dispatcher = Dispatcher(connections, 0, RecentErrors(30), GatewayMetrics(), 5.0, index)
    try:
        connection = connections.get(first.address)
        await asyncio.wait_for(connection.connected.wait(), PATIENCE_S)
        doomed.process.send_signal(signal.SIGSTOP)  # it cannot answer; its socket stays open
        opening = asyncio.create_task(dispatcher.open(request, [first, second]))
        await until(lambda: connections.open_requests(first.address) == 1, "the request reaching the frozen engine")
        doomed.process.kill()
        try:
            opened = await opening
        except OpenAIError as error:
            return error, connections.open_requests(second.address)
        messages = [m async for m in opened.messages()]
        opened.stream.close()
        return (opened.engine.engine_id, messages[-1]), None
    finally:
        await connections.close()


@pytest.mark.asyncio
async def test_an_engine_lost_before_the_first_token_is_replaced_once(redis_url, engines):
    a, b = engines("qa"), engines("qb")
    request = job()
    (served_by, final), _ = await open_where_first_dies(redis_url, a, b, request)
    assert served_by == "qb" and final.final.usage.completion_tokens == 4
    assert request.engines_lost == ["qa"]


@pytest.mark.asyncio
async def test_a_second_engine_lost_refuses_the_request_and_spares_the_next(redis_url, engines):
    a, b = engines("qc"), engines("qd")
    request = job()
    request.lose_engine("an-earlier-one")  # as the gateway counts an engine that died mid-answer
    error, sent_to_next = await open_where_first_dies(redis_url, a, b, request)
    assert error.status == 502 and error.code == "request_crashed_engines" and "cmpl-qod" in error.message
    assert sent_to_next == 0 and b.process.poll() is None
    assert request.engines_lost == ["an-earlier-one", "qc"]


def test_a_request_that_kills_two_engines_mid_answer_is_refused_and_the_third_is_spared(redis_url, engines, tmp_path):
    fleet = {name: engines(name) for name in ("qe", "qf", "qg")}
    gateway = start_gateway(redis_url, str(tmp_path / "gateway.log"))
    killed = []

    def killer():
        """Kill the engine running the request, twice (the heartbeat says which, within a second)."""
        while len(killed) < 2:
            running = wait_until(lambda: [n for n, e in fleet.items() if n not in killed and (e.registry_entry() or {})
                                          .get("running")], timeout_s=PATIENCE_S, what="an engine running the request")
            fleet[running[0]].process.kill()
            fleet[running[0]].process.wait()
            killed.append(running[0])

    try:
        thread = threading.Thread(target=killer)
        thread.start()
        # the whole context: long enough on any machine to outlast a heartbeat on each engine
        status, headers, body = http_json(f"{gateway.url}/v1/completions", {
            "model": "tiny-random", "prompt": "Tell me everything", "max_tokens": 8000, "temperature": 0,
        }, timeout_s=600)
        thread.join(timeout=PATIENCE_S)
        assert status == 502 and body["error"]["code"] == "request_crashed_engines", body
        assert headers["x-should-retry"] == "false"
        [spared] = [e for name, e in fleet.items() if name not in killed]
        assert spared.process.poll() is None and spared.registry_entry()["running"] == 0
        request_id = body["error"]["message"].rsplit("request ", 1)[1].rstrip(")")
        assert f"request {request_id} lost engines {killed[0]}, {killed[1]}" in gateway.log()
    finally:
        gateway.stop()
