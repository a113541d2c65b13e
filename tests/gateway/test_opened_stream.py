"""How the dispatcher reads the end of an engine's answer: a Final whose finish reason the
gateway knows is the answer's end; one it does not know (an engine newer than the gateway) is
an error, never reported to the client as "stop"."""

import asyncio
import time

import pytest

from proto import k25_pb2
from services.gateway.dispatch import OpenedStream
from services.gateway.engine_errors import RecentErrors
from services.gateway.errors import OpenAIError
from services.gateway.routing import EngineView

ENGINE = EngineView("e1", "127.0.0.1:1", "short", "m", 256, 2048, 1.0, 0, 0, 0.92, 1024, heartbeat_ttl_s=5.0)


def read(final: k25_pb2.Final) -> list[k25_pb2.EngineMessage]:
    """Every message OpenedStream yields when the engine's first message is `final`."""
    opened = OpenedStream("short", ENGINE, stream=None, first=k25_pb2.EngineMessage(final=final),
                          deadline=time.time() + 60, errors=RecentErrors(30))

    async def collect():
        return [message async for message in opened.messages()]

    return asyncio.run(collect())


@pytest.mark.parametrize("reason", [k25_pb2.STOP, k25_pb2.LENGTH])
def test_a_known_finish_reason_ends_the_answer(reason):
    [message] = read(k25_pb2.Final(request_id="r1", finish_reason=reason))
    assert message.final.finish_reason == reason


@pytest.mark.parametrize("reason", [k25_pb2.FINISH_REASON_UNSPECIFIED, 99])
def test_a_finish_reason_the_gateway_does_not_know_is_a_502(reason):
    with pytest.raises(OpenAIError) as failed:
        read(k25_pb2.Final(request_id="r1", finish_reason=reason))
    assert (failed.value.status, failed.value.code) == (502, "engine_error")
    assert f"finish reason {reason}" in failed.value.message
