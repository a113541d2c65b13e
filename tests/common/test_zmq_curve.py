"""CURVE between real ZMQ sockets: key holders talk, everyone else fails the handshake
(seen on the sockets' monitors, so no test waits on a clock), and bad keys are refused
with a message that says what a key is."""

import contextlib

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from common.zmq_curve import ENV, CurveKeyError, admit_key_holders, make_client, make_server, new_secret_key, \
    secret_key_from_env

DEADLINE_MS = 30_000


@contextlib.contextmanager
def curve_router(secret_key: bytes):
    context = zmq.Context()
    authenticator = admit_key_holders(context, secret_key)
    router = context.socket(zmq.ROUTER)
    make_server(router, secret_key)
    router.bind("tcp://127.0.0.1:0")
    try:
        yield context, router, router.getsockopt_string(zmq.LAST_ENDPOINT)
    finally:
        authenticator.stop()
        context.destroy(linger=0)  # also the sockets a failed assertion left open


def dealer(context: zmq.Context, endpoint: str, secret_key: bytes | None) -> zmq.Socket:
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    if secret_key is not None:
        make_client(socket, secret_key)
    return socket


def wait_for_event(monitor: zmq.Socket, wanted: int) -> int:
    poller = zmq.Poller()
    poller.register(monitor, zmq.POLLIN)
    while poller.poll(DEADLINE_MS):
        event = recv_monitor_message(monitor)["event"]
        if event & wanted:
            return event
    raise AssertionError(f"no monitor event in {wanted:#x} within {DEADLINE_MS} ms")


def test_a_key_holder_is_served_and_the_traffic_is_encrypted():
    key = new_secret_key().encode()
    with curve_router(key) as (context, router, endpoint):
        client = dealer(context, endpoint, key)
        client.connect(endpoint)
        client.send(b"hello")
        assert router.poll(DEADLINE_MS), "the key holder's message never arrived"
        identity, body = router.recv_multipart()
        assert body == b"hello"
        router.send_multipart([identity, b"world"])
        assert client.poll(DEADLINE_MS) and client.recv() == b"world"


@pytest.mark.parametrize("client_key", ["another key", "no key"])
def test_a_client_without_the_key_never_reaches_the_server(client_key):
    key = new_secret_key().encode()
    with curve_router(key) as (context, router, endpoint):
        monitor = router.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        intruder = dealer(context, endpoint, new_secret_key().encode() if client_key == "another key" else None)
        intruder.connect(endpoint)
        intruder.send(b"free tokens please")
        event = wait_for_event(monitor, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                               | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        assert event != zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert router.poll(0) == 0  # a connection that failed its handshake delivers nothing, ever
        router.disable_monitor()


def test_the_key_comes_from_the_environment_and_empty_means_off():
    key = new_secret_key()
    assert secret_key_from_env({ENV: key}) == key.encode()
    assert secret_key_from_env({ENV: f"  {key}\n"}) == key.encode()  # as a mounted file or a shell leaves it
    assert secret_key_from_env({}) is None
    assert secret_key_from_env({ENV: ""}) is None


@pytest.mark.parametrize("bad", ["short", "x" * 39 + "~", "é" * 40, "#" * 40])
def test_a_malformed_key_is_refused_with_what_a_key_is(bad):
    with pytest.raises(CurveKeyError, match=f"{ENV} must be 40 Z85 characters"):
        secret_key_from_env({ENV: bad})


@pytest.mark.parametrize("part", ["engine", "gateway", "chunker"])
def test_every_zmq_part_refuses_to_start_with_a_malformed_key(part, monkeypatch, capsys):
    from k25.cli import build_parser

    monkeypatch.setenv(ENV, "not-a-key")
    args = build_parser().parse_args([part])
    assert args.handler(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"k25 {part}: {ENV} must be 40 Z85 characters (a CURVE secret key); got 9 characters that are not one"
