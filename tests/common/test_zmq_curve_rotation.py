"""A CURVE key rotation without an outage, between real ZMQ sockets: during a rotation a
server admits the holders of the current and of the next key and refuses everyone else, and at
every step of the documented procedure (add-next, promote, remove-old) a pod with the settings
before the step and a pod with the settings after it reach each other either way round, through
the gateway's own engine and chunker clients. Waits are on events (a handshake, a message),
never on a clock."""

import asyncio
import contextlib
import itertools
import threading

import pytest
import zmq

from common.zmq_curve import ENV, NEXT_ENV, PREVIOUS_ENV, CurveKeyError, CurveKeys, keys_from_env, make_client, new_secret_key
from common.zmq_router import bind_router
from operators.config import CURVE_NEXT_KEY_KEY, CURVE_PREVIOUS_KEY_KEY, CURVE_SECRET_KEY_KEY
from operators.curve_rotation import STEPS, rotation_step
from proto import k25_pb2
from services.gateway.chunker_client import ChunkerClient
from services.gateway.engine_client import EngineConnections
from tests.common.test_zmq_curve import wait_for_event

DEADLINE_S = 30
# which Secret key each process reads as which variable (the chart's k25.curveEnv, the operator's engine_env)
ENV_OF_KEY = {CURVE_SECRET_KEY_KEY: ENV, CURVE_NEXT_KEY_KEY: NEXT_ENV, CURVE_PREVIOUS_KEY_KEY: PREVIOUS_ENV}


def pod_keys(secret_data: dict[str, str]) -> CurveKeys:
    """The keys a pod started from this Secret holds."""
    return keys_from_env({ENV_OF_KEY[key]: value for key, value in secret_data.items()})


@contextlib.contextmanager
def server(keys: CurveKeys):
    """An engine's or the chunker's listening socket (common.zmq_router.bind_router) with these keys."""
    context = zmq.Context()
    router, port, authenticator = bind_router(context, "127.0.0.1", 0, 100, 100, 0, curve_secret_key=keys)
    try:
        yield router, f"127.0.0.1:{port}"
    finally:
        router.close(linger=0)
        authenticator.stop()
        context.term()


async def engine_receives(client_keys: CurveKeys, address: str, router: zmq.Socket) -> bytes:
    """What the engine at `address` receives from a gateway with `client_keys` (its EngineConnections)."""
    connections = EngineConnections(curve_secret_key=client_keys)
    try:
        request = k25_pb2.GenerateRequest(request_id="r-1", prompt_token_ids=[1, 2, 3])
        await connections.get(address).submit(request, connect_timeout_s=DEADLINE_S)
        assert await asyncio.to_thread(router.poll, DEADLINE_S * 1000), "the engine never got the request"
        _, payload = router.recv_multipart()
        return k25_pb2.ClientMessage.FromString(payload).generate.request_id
    finally:
        await connections.close()


async def chunker_answers(client_keys: CurveKeys, address: str, router: zmq.Socket) -> str:
    """A chunk request's answer from the chunker at `address`, asked by a gateway with `client_keys`."""
    def answer_one():
        assert router.poll(DEADLINE_S * 1000), "the chunker never got the request"
        identity, payload = router.recv_multipart()
        request = k25_pb2.ChunkRequest.FromString(payload)
        router.send_multipart([identity, k25_pb2.ChunkResponse(request_id=request.request_id,
                                                               total_tokens=len(request.text)).SerializeToString()])

    client = ChunkerClient(f"tcp://{address}", timeout_s=DEADLINE_S, curve_secret_key=client_keys)
    answering = threading.Thread(target=answer_one)
    answering.start()
    try:
        return (await client.chunk("four")).total_tokens
    finally:
        answering.join()
        client.close()


def secrets_of_a_rotation() -> list[dict[str, str]]:
    """The transport Secret before the rotation and after each of its steps."""
    data = [{CURVE_SECRET_KEY_KEY: new_secret_key()}]
    for step in STEPS:
        data.append(rotation_step(data[-1], step, new_secret_key()))
    return data


def test_a_rotation_moves_the_secret_from_one_key_to_the_next():
    before, adding, promoted, after = secrets_of_a_rotation()
    old, new = before[CURVE_SECRET_KEY_KEY], adding[CURVE_NEXT_KEY_KEY]
    assert adding == {CURVE_SECRET_KEY_KEY: old, CURVE_NEXT_KEY_KEY: new}
    assert promoted == {CURVE_SECRET_KEY_KEY: new, CURVE_PREVIOUS_KEY_KEY: old}
    assert after == {CURVE_SECRET_KEY_KEY: new}
    assert old != new


def test_during_a_rotation_holders_of_either_key_reach_a_server_and_no_one_else_does():
    old, new = new_secret_key().encode(), new_secret_key().encode()
    with server(CurveKeys(old, (new,))) as (router, address):
        for client in (CurveKeys(old), CurveKeys(new, (old,))):  # a pod not rotated yet, a promoted pod
            assert asyncio.run(engine_receives(client, address, router)) == "r-1"
        monitor = router.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        intruder = router.context.socket(zmq.DEALER)
        make_client(intruder, new_secret_key().encode(), zmq.curve_public(old))
        intruder.connect(f"tcp://{address}")
        intruder.send(b"free tokens please")
        assert wait_for_event(monitor, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH) \
            == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        assert router.poll(0) == 0
        intruder.close(linger=0)
        router.disable_monitor()
        monitor.close(linger=0)


@pytest.mark.parametrize("step", range(len(STEPS)), ids=STEPS)
def test_at_every_step_a_pod_before_it_and_a_pod_after_it_talk_both_ways(step):
    before, after = (pod_keys(data) for data in secrets_of_a_rotation()[step:step + 2])
    for client, served in itertools.product((before, after), repeat=2):
        with server(served) as (router, address):
            assert asyncio.run(engine_receives(client, address, router)) == "r-1"
        with server(served) as (router, address):
            assert asyncio.run(chunker_answers(client, address, router)) == 4


@pytest.mark.parametrize(("data", "step", "problem"), [
    ({CURVE_SECRET_KEY_KEY: "k" * 40, CURVE_NEXT_KEY_KEY: "n" * 40}, "add-next", "a rotation is under way"),
    ({CURVE_SECRET_KEY_KEY: "k" * 40, CURVE_PREVIOUS_KEY_KEY: "p" * 40}, "add-next", "a rotation is under way"),
    ({CURVE_SECRET_KEY_KEY: "k" * 40}, "promote", "nothing to promote"),
    ({CURVE_SECRET_KEY_KEY: "k" * 40, CURVE_NEXT_KEY_KEY: "n" * 40}, "remove-old", "nothing to remove"),
    ({}, "add-next", "no curve-secret-key"),
    ({CURVE_SECRET_KEY_KEY: "k" * 40}, "rewind", "unknown step"),
])
def test_a_step_refuses_a_secret_that_is_not_where_it_starts(data, step, problem):
    from operators.curve_rotation import RotationError

    with pytest.raises(RotationError, match=problem):
        rotation_step(data, step, new_secret_key())


def test_other_fields_of_the_secret_are_kept():
    data = {CURVE_SECRET_KEY_KEY: new_secret_key(), "note": "kept"}
    assert rotation_step(data, "add-next", new_secret_key())["note"] == "kept"


def test_the_second_key_comes_from_the_environment_and_needs_a_current_one():
    current, other = new_secret_key(), new_secret_key()
    assert keys_from_env({ENV: current}) == CurveKeys(current.encode())
    assert keys_from_env({ENV: current, NEXT_ENV: f"{other}\n"}) == CurveKeys(current.encode(), (other.encode(),))
    assert keys_from_env({ENV: current, PREVIOUS_ENV: other}) == CurveKeys(current.encode(), (other.encode(),))
    assert keys_from_env({}) is None
    with pytest.raises(CurveKeyError, match="needs the current one"):
        keys_from_env({NEXT_ENV: other})
    with pytest.raises(CurveKeyError, match=f"{NEXT_ENV} must be 40 Z85 characters"):
        keys_from_env({ENV: current, NEXT_ENV: "short"})
