"""bind_router: the ROUTER every service listens on, on an IPv4 or IPv6 address, with its options
and, given the release's CURVE key, the handler that admits only its holders."""

import pytest
import zmq

from common.zmq_curve import make_client, new_secret_key
from common.zmq_router import bind_router, tcp_endpoint


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_router_bound_to_an_address_serves_a_dealer_there(host):
    context = zmq.Context()
    router, port, _ = bind_router(context, host, 0, 10, 10, 0, {zmq.MAXMSGSIZE: 1024})
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IPV6, 1)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(tcp_endpoint(host, port))
    dealer.send(b"ping")
    assert router.poll(30_000) and router.recv_multipart()[1] == b"ping"
    assert router.getsockopt(zmq.MAXMSGSIZE) == 1024
    dealer.close()
    router.close()
    context.term()


def test_a_taken_port_raises_and_leaves_nothing_open():
    context = zmq.Context()
    router, port, _ = bind_router(context, "127.0.0.1", 0, 10, 10, 0)
    other = zmq.Context()
    with pytest.raises(zmq.ZMQError):
        bind_router(other, "127.0.0.1", port, 10, 10, 0)
    assert other.closed
    router.close()
    context.term()


def test_with_a_curve_key_a_holder_is_served_and_a_taken_port_leaves_nothing_open():
    key = new_secret_key().encode()
    context = zmq.Context()
    router, port, authenticator = bind_router(context, "127.0.0.1", 0, 10, 10, 0, curve_secret_key=key)
    assert router.curve_server and authenticator.is_alive()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    make_client(dealer, key)
    dealer.connect(tcp_endpoint("127.0.0.1", port))
    dealer.send(b"ping")
    assert router.poll(30_000) and router.recv_multipart()[1] == b"ping"
    other = zmq.Context()
    with pytest.raises(zmq.ZMQError):
        bind_router(other, "127.0.0.1", port, 10, 10, 0, curve_secret_key=key)
    assert other.closed  # its ZAP handler stopped first, or terminating the context would hang
    dealer.close()
    router.close()
    authenticator.stop()
    context.term()
