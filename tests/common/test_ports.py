"""A free port: never one the caller reserved for itself."""

from common import ports


def test_a_free_port_is_none_of_the_reserved_ones(monkeypatch):
    """`k25 up` picks ports for its parts while the gateway's is still unbound: when the OS hands
    out that one, another is taken."""
    handed_out = iter([8000, 8000, 41234])

    class Socket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(handed_out)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(ports.socket, "socket", Socket)
    assert ports.free_port(frozenset({8000})) == 41234
