"""A free TCP port on this machine, for processes started here (`k25 up`'s parts, the stacks a
benchmark starts)."""

import socket


def free_port(reserved: frozenset[int] = frozenset()) -> int:
    """A port free now that is none of `reserved` (ports the caller is about to bind itself, such
    as `k25 up`'s gateway's: the OS may hand one of them out while it is still unbound)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in reserved:
            return port
