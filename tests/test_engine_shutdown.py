"""`k25 engine` stops cleanly on SIGTERM: its registry entry goes at once, running requests
finish within the drain timeout (new ones are refused with CANCELLED) and what is left after
it is answered CANCELLED."""

import time


import pytest
from engine_process import dealer, generate_message, receive, request_id_of, send, start_engine
from redis_server import module_redis_url  # noqa: F401 (fixture)

from proto import k25_pb2


@pytest.fixture(scope="module")
def engine(module_redis_url, tmp_path_factory):
    handle = start_engine(
        module_redis_url, str(tmp_path_factory.mktemp("engine") / "engine.log"),
        "--model", "tiny-random", "--chunk-size", "32", "--max-chunk-per-gpu", "64", "--drain-timeout-s", "2",
    )
    yield handle
    if handle.process.poll() is None:
        handle.stop()


def test_sigterm_drains_then_cancels_removes_the_heartbeat_and_exits_zero(engine):
    client = dealer(engine.address)
    short = generate_message([1, 2, 3, 4, 5], 32, max_tokens=40, ignore_eos=True)
    endless = generate_message([6, 7, 8], 32, max_tokens=2000, ignore_eos=True)
    for message in (short, endless):
        send(client, message)
    assert receive(client).delta  # running
    assert engine.registry_entry() is not None

    engine.process.terminate()
    time.sleep(0.3)
    late = generate_message([9, 10], 32, max_tokens=4)
    send(client, late)
    last = {}  # request id -> its final message or error
    while len(last) < 3:
        message = receive(client)
        if message.WhichOneof("kind") != "delta":
            last[request_id_of(message)] = message
    assert last[late.generate.request_id].error.code == k25_pb2.CANCELLED  # refused while draining
    assert engine.registry_entry() is None  # unregistered at once
    assert last[short.generate.request_id].final.usage.completion_tokens == 40  # finished
    assert last[endless.generate.request_id].error.code == k25_pb2.CANCELLED  # still running after 2 s

    assert engine.process.wait(timeout=30) == 0
    assert "Traceback" not in engine.log()
    client.close()
