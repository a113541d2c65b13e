"""`k25 engine` stops cleanly on SIGTERM: running requests are answered, its registry entry goes."""


import pytest

from proto import k25_pb2
from tests.helpers.engine_process import dealer, generate_message, receive, receive_until_done, send, start_engine
from tests.helpers.redis_server import module_redis_url  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def engine(module_redis_url, tmp_path_factory):
    handle = start_engine(
        module_redis_url, str(tmp_path_factory.mktemp("engine") / "engine.log"),
        "--model", "tiny-random", "--chunk-size", "32", "--max-chunk-per-gpu", "64",
    )
    yield handle
    if handle.process.poll() is None:
        handle.stop()


def test_sigterm_answers_running_requests_removes_the_heartbeat_and_exits_zero(engine):
    client = dealer(engine.address)
    message = generate_message([1, 2, 3, 4, 5], 32, max_tokens=1500, ignore_eos=True)
    request_id = message.generate.request_id
    send(client, message)
    assert receive(client).delta.request_id == request_id  # it is running
    assert engine.registry_entry() is not None

    engine.process.terminate()
    last = receive_until_done(client, request_id)[-1]

    assert last.error.code == k25_pb2.CANCELLED
    assert engine.process.wait(timeout=30) == 0
    assert engine.registry_entry() is None
    assert "Traceback" not in engine.log()
    client.close()
