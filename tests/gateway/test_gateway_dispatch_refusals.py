"""What the dispatcher decides before it contacts any engine: wait for one to register (a
pool starting from zero), or refuse at once."""

import asyncio
import time
from dataclasses import replace

import pytest

from proto import k25_pb2
from services.gateway.dispatch import Dispatcher, Job, NoEngineYet
from services.gateway.engine_client import EngineConnections
from services.gateway.engine_errors import RecentErrors
from services.gateway.errors import OpenAIError
from services.gateway.metrics import GatewayMetrics
from services.gateway.routing import EngineView, PoolInfo

SHORT = EngineView("s1", "127.0.0.1:1", "short", "m", 256, 2048, 1.0, 0, 0, 0.92, 1024, heartbeat_ttl_s=5.0)


def job(prompt_tokens: int) -> Job:
    return Job(request_id="r1", tenant="t", model="m", prompt_token_ids=[5] * prompt_tokens,
               sampling=k25_pb2.SamplingParams(max_tokens=10), deadline=time.time() + 60)


def refusal(engines, pools, prompt_tokens=100) -> OpenAIError:
    async def scenario():
        connections = EngineConnections()
        try:
            await Dispatcher(connections, 0, RecentErrors(30), GatewayMetrics()).open(job(prompt_tokens), engines, pools)
        finally:
            await connections.close()

    with pytest.raises(OpenAIError) as refused:
        asyncio.run(scenario())
    return refused.value


@pytest.mark.parametrize("engines", [[], [replace(SHORT, healthy=False)], [replace(SHORT, draining=True)]])
def test_with_no_routable_engine_one_may_come(engines):
    error = refusal(engines, [PoolInfo("short", 256, 2048)])
    assert isinstance(error, NoEngineYet) and error.pool == "short" and error.status == 503
    assert "retry-after" in {name.lower() for name in error.headers}


def test_a_request_only_a_pool_without_engines_holds_waits_for_it():
    error = refusal([SHORT], [PoolInfo("short", 256, 2048), PoolInfo("long", 4096)], prompt_tokens=3000)
    assert isinstance(error, NoEngineYet) and error.pool == "long"


def test_a_request_no_known_pool_holds_is_refused_at_once():
    error = refusal([SHORT], [PoolInfo("short", 256, 2048)], prompt_tokens=3000)
    assert not isinstance(error, NoEngineYet)
    assert error.status == 400 and error.code == "context_length_exceeded"


def test_the_message_after_waiting_names_the_pool_and_the_wait():
    error = NoEngineYet("long", waited_s=2.5)
    assert error.headers == {"Retry-After": "3"} and "'long'" in error.message and "2.5 s" in error.message
    assert NoEngineYet(None).headers == {"Retry-After": "1"}
