"""Answers that did not end normally, through a gateway in this process and real `k25 engine`s
(the tiny model, each draining with no wait): a non-streamed answer that an engine's drain cut
is run again from the start on the other engine; an answer the engine stopped (a Final ABORT)
is an error, not a normal finish; and the gateway's own failure mid-stream ends the stream
with an error event that quotes the request id, its details only in the log."""

import asyncio
import json
import logging
import re
import signal
import time

import pytest
import redis
from opentelemetry import trace

from common.tokenizer import load_tokenizer
from services.gateway.api_keys import ANONYMOUS
from services.gateway.errors import OpenAIError
from services.gateway.openai_schema import CompletionRequest
from services.gateway.service import Gateway, ReplyShape
from services.gateway.settings import GatewaySettings
from tests.helpers.engine_process import RELEASE, start_engine
from tests.helpers.redis_server import module_redis_url  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

# tokens asked for (EOS ignored): an answer runs far longer than the test takes to signal its engine
LONG = 512
SECRET = "Traceback (most recent call last): /srv/k25/services/gateway/documents.py KeyError at 10.0.3.7:5557"


@pytest.fixture(scope="module")
def engines(module_redis_url, tmp_path_factory):  # noqa: F811
    """Two engines; a SIGTERM ends what one runs at once (--drain-timeout-s 0). The gateway
    tests that need one engine pass whichever of the two is still up."""
    folder = tmp_path_factory.mktemp("unfinished")
    started = {}
    try:
        for name in ("a", "b"):
            started[name] = start_engine(module_redis_url, str(folder / f"{name}.log"), "--model", "tiny-random",
                                         "--chunk-size", "64", "--drain-timeout-s", "0", engine_id=name)
        yield started
    finally:
        for engine in started.values():
            engine.stop()


def with_gateway(redis_url: str, scenario):
    """Run `scenario(gateway)` against a started gateway in this process."""
    async def run():
        settings = GatewaySettings(model="tiny-random", redis_url=redis_url, release=RELEASE)
        gateway = Gateway(settings, load_tokenizer("tiny-random"), redis.Redis.from_url(redis_url))
        await gateway.start()
        try:
            return await scenario(gateway)
        finally:
            await gateway.stop()

    return asyncio.run(run())


def completion(gateway: Gateway, stream: bool, max_tokens: int = LONG):
    body = CompletionRequest(model="tiny-random", prompt="Once upon a time", max_tokens=max_tokens, temperature=0,
                             stream=stream)
    job = gateway.make_job(body, gateway.tokenizer.encode(body.prompt), ANONYMOUS, "cmpl")
    job.sampling.ignore_eos = True
    return body, job


def open_request(gateway: Gateway):
    """The engine connection and request id of the one request open on an engine."""
    [(connection, request_id)] = [(c, rid) for c in gateway.connections.by_address.values() for rid in c.streams]
    return connection, request_id


FIRST_TOKEN_TIMEOUT_S = 120  # far beyond a tiny model's first token on a busy machine: a request this slow has hung


async def first_token(gateway: Gateway):
    """Once the gateway has the first token of its one open request: that request's connection and id."""
    deadline = time.monotonic() + FIRST_TOKEN_TIMEOUT_S
    while not sum(s.value for m in gateway.metrics.ttft.collect() for s in m.samples if s.name.endswith("_count")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no first token within {FIRST_TOKEN_TIMEOUT_S} s")
        await asyncio.sleep(0.01)
    return open_request(gateway)


def statuses(gateway: Gateway) -> dict[str, float]:
    """Requests answered, by HTTP status (what the outcome booked)."""
    return {s.labels["status"]: s.value for m in gateway.metrics.requests.collect() for s in m.samples
            if s.name.endswith("_total")}


def event(line: str) -> dict | str:
    payload = line.removeprefix("data: ").strip()
    return payload if payload == "[DONE]" else json.loads(payload)


def test_a_non_streamed_answer_cut_by_a_drain_is_run_again_on_another_engine(engines, module_redis_url, caplog):  # noqa: F811
    async def scenario(gateway):
        body, job = completion(gateway, stream=False)
        answer = asyncio.create_task(gateway.complete(body, job, False, trace.INVALID_SPAN))
        connection, _ = await first_token(gateway)
        [drained] = [e for e in engines.values() if connection.address.endswith(f":{e.zmq_port}")]
        drained.process.send_signal(signal.SIGTERM)  # it ends the running request CANCELLED at once
        return drained, await answer, statuses(gateway)

    with caplog.at_level(logging.WARNING, logger="services.gateway.service"):
        drained, response, booked = with_gateway(module_redis_url, scenario)
    assert drained.process.wait(timeout=60) == 0
    # the answer had started there and was cut, not handed back unstarted
    assert "drain ended (its drain timeout of 0 s passed) with 1 requests still running" in drained.log()
    assert "starting it again elsewhere" in caplog.text
    body = json.loads(response.body)
    assert response.status_code == 200 and booked == {"200": 1}
    assert body["usage"]["completion_tokens"] == LONG and body["choices"][0]["finish_reason"] == "length"


def test_a_non_streamed_answer_the_engine_stopped_is_an_error_not_a_finish(engines, module_redis_url):  # noqa: F811
    async def scenario(gateway):
        body, job = completion(gateway, stream=False)
        answer = asyncio.create_task(gateway.complete(body, job, False, trace.INVALID_SPAN))
        connection, request_id = await first_token(gateway)
        connection.cancel(request_id)  # the engine stops it and answers with a Final ABORT
        with pytest.raises(OpenAIError) as failed:
            await answer
        return failed.value, statuses(gateway)

    error, booked = with_gateway(module_redis_url, scenario)
    assert (error.status, error.type, error.code) == (502, "server_error", "engine_aborted")
    assert "incomplete" in error.message and booked == {"502": 1}


def test_a_streamed_answer_the_engine_stopped_ends_with_an_error_event(engines, module_redis_url):  # noqa: F811
    async def scenario(gateway):
        body, job = completion(gateway, stream=True)
        events = (await gateway.complete(body, job, False, trace.INVALID_SPAN)).body_iterator
        first = await anext(events)
        connection, request_id = open_request(gateway)
        connection.cancel(request_id)  # the engine stops it and answers with a Final ABORT
        return [event(first), *[event(line) async for line in events]], statuses(gateway)

    events, booked = with_gateway(module_redis_url, scenario)
    assert "[DONE]" not in events and not any(e["choices"][0]["finish_reason"] for e in events[:-1])
    assert events[-1]["error"]["code"] == "engine_aborted" and booked == {"502": 1}


def test_the_gateway_failing_mid_stream_ends_it_with_an_error_event_quoting_the_request_id(
        engines, module_redis_url, caplog):  # noqa: F811
    def failing_epilogue(text):  # e.g. a bug in what /v1/documents/ask adds after the answer
        raise KeyError(SECRET)

    async def scenario(gateway):
        _, job = completion(gateway, stream=True, max_tokens=4)
        response = await gateway.stream(job, ReplyShape(chat=False), trace.INVALID_SPAN, failing_epilogue)
        return [line async for line in response.body_iterator], statuses(gateway)

    with caplog.at_level(logging.ERROR, logger="services.gateway.service"):
        lines, booked = with_gateway(module_redis_url, scenario)
    events = [event(line) for line in lines]
    assert events[-2]["choices"][0]["finish_reason"] == "length"  # the whole answer went out first
    error = events[-1]["error"]
    assert (error["type"], error["code"]) == ("server_error", "internal_error") and booked == {"500": 1}
    assert SECRET not in "".join(lines) and "[DONE]" not in events
    request_id = re.search(r"request id (req_\w+)", error["message"]).group(1)
    [record] = [r for r in caplog.records if request_id in r.getMessage()]
    assert record.exc_info and SECRET in str(record.exc_info[1])
