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


def test_a_peer_that_stopped_reading_is_dropped_at_its_bound_and_the_others_are_not(pair):
    router, _, identity = pair
    reader = router.context.socket(zmq.DEALER)
    reader.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    reader.send(b"hello")
    other, _ = router.recv_multipart()
    outbox = Outbox(router)
    for _ in range(40):
        outbox.put(identity, bytes(1_000_000), messages=10)  # kernel buffers fill: most wait here
    outbox.flush()
    stuck = outbox.pending
    assert stuck >= 50
    outbox.put(other, b"y", messages=3)
    assert outbox.drop_stalled(limit=10_000) == []  # under the bound: it may still catch up
    assert outbox.drop_stalled(limit=50) == [identity]
    assert (outbox.pending, outbox.pending_frames) == (3, 1)  # the reader's frame is still there
    assert outbox.flush() == [] and outbox.pending == 0
    assert reader.poll(10_000, zmq.POLLIN) and reader.recv() == b"y"
    reader.close(linger=0)
