"""engine.serve.outbox on a real ROUTER/DEALER pair: a full peer waits, a gone peer is reported."""

import time

import pytest
import zmq

from engine.serve.outbox import Outbox


@pytest.fixture
def pair():
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.SNDHWM, 1)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    peer = context.socket(zmq.DEALER)
    peer.setsockopt(zmq.RCVHWM, 1)
    peer.connect(f"tcp://127.0.0.1:{port}")
    peer.send(b"hello")  # the ROUTER learns the peer's identity from its first frame
    identity, _ = router.recv_multipart()
    yield router, peer, identity
    for socket in (router, peer):
        socket.close(linger=0)
    context.term()


def test_a_peer_that_does_not_read_holds_its_messages_in_order_until_it_does(pair):
    router, peer, identity = pair
    outbox = Outbox(router)
    big = 1_000_000  # large enough that kernel buffers fill after a few
    for i in range(40):
        outbox.put(identity, i.to_bytes(4, "big") + bytes(big))
    assert outbox.flush() == []
    assert outbox.pending > 0  # the send would block: the rest wait here, nothing is dropped

    received = []
    deadline = time.monotonic() + 30
    while len(received) < 40 and time.monotonic() < deadline:
        if peer.poll(10, zmq.POLLIN):
            received.append(int.from_bytes(peer.recv()[:4], "big"))
        outbox.flush()
    assert received == list(range(40))
    assert outbox.pending == 0


def test_a_peer_that_is_gone_is_reported_and_its_messages_dropped(pair):
    router, _, identity = pair
    outbox = Outbox(router)
    outbox.put(b"nobody", b"x")
    outbox.put(b"nobody", b"y")
    outbox.put(identity, b"z")
    assert outbox.flush() == [b"nobody"]
    assert outbox.pending == 0
